"""Scheduling parity with a real Slurm: each scenario runs on both at once and their decisions are compared.

A scenario (``tests/fixtures/parity/NAME.toml``) gives slurm.conf lines (weights, partitions, limits),
``sacctmgr`` commands, jobs (``sleep`` of a given length, ``sbatch`` options, a user, a moment) and
administrator commands at moments; ``{NAME}`` in a job's options or a command is the id the job named NAME
got on that system. Both systems get the same base slurm.conf (4 nodes gpu[01-04] of 64 CPUs,
257,000 MiB and 8 A100s: ``ops/slurm/setup.sh``'s), the same lines, the same commands, at the same moments,
through their commands as processes. Every second both queues are read; at each check moment the pending
reasons, ``sprio`` factors and ``squeue --start`` are taken. Compared, job by job: when it started (equal
within ``--slack`` seconds: Slurm's backfill runs every ``bf_interval``), the reason it showed at each check
and each ``sprio`` factor (equal within 1: both truncate). ``--record`` keeps Slurm's observations beside the
scenario, where rota's tests replay them through the core.

    ops/slurm/setup.sh (with WITH_DBD=1: accounts and QOS) && make parity-vs-slurm
    python -m rota.bench.parity tests/fixtures/parity/backfill.toml --record
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
SCENARIOS = HERE / "tests" / "fixtures" / "parity"
ROTA_BIN = Path(sys.executable).parent
SLURM_BIN = Path("/usr/bin")
USERS = {"alice": 2001, "bob": 2002, "carol": 2003}
NODE = ("NodeName=gpu{i:02d} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=64 RealMemory=257000 "
        "Gres=gpu:a100:8 State=UNKNOWN")
# what each system's squeue/sprio print, one line a job
QUEUE = "%i|%F|%j|%T|%r|%S"
SPRIO = "%i|%Y|%A|%F|%J|%P|%Q|%N"
FACTORS = ("priority", "age", "fairshare", "jobsize", "partition", "qos", "nice")


def load(path: Path) -> dict:
    with open(path, "rb") as fh:
        sc = tomllib.load(fh)
    sc["name"] = path.stem
    sc.setdefault("checks", [])
    sc.setdefault("sacctmgr", [])
    sc.setdefault("do", [])
    return sc


def scenario_conf(base: str, sc: dict) -> str:
    """``base`` with the scenario's lines: a key it sets replaces the base's, its partitions replace the
    base's."""
    return over(base, sc.get("conf", ""))


def for_rota(conf: str) -> str:
    """The scenario's file as rota gets it: with Slurm's behaviour where rota's differs by design: its cadence
    (``rota_cadence=slurm``: backfill every ``bf_interval``, the main scheduler's strict-priority pass at a change
    between) and whole-node reservations (``rota_reserve=nodes``)."""
    lines = conf.splitlines()
    for i, ln in enumerate(lines):
        if ln.lower().startswith("schedulerparameters="):
            lines[i] = ln + ",rota_cadence=slurm,rota_reserve=nodes"
            break
    else:
        lines.append("SchedulerParameters=rota_cadence=slurm,rota_reserve=nodes")
    return "\n".join(lines) + "\n"


def over(base: str, lines: str) -> str:
    """``base`` with ``lines`` in place of the same keys (NodeName and PartitionName lines: all of them)."""
    new = [ln for ln in lines.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    keys = {ln.split("=", 1)[0].strip().lower() for ln in new}
    kept = [ln for ln in base.splitlines() if ln.split("=", 1)[0].strip().lower() not in keys]
    return "\n".join(kept + new) + "\n"


def base_conf(host: str, original: str) -> str:
    """Slurm's own file as ops/slurm/setup.sh wrote it (``original``) with the scheduling settings both systems
    share (``base.conf`` beside the scenarios), its nodes reachable as Slurm's setup made them."""
    shared = (SCENARIOS / "base.conf").read_text()
    nodes = "\n".join(NODE.format(i=i, host=host, port=17000 + i) for i in range(1, 5))
    return over(over(original, shared), nodes)


class System:
    """One scheduler driven through its commands."""

    name = ""
    bin: Path = SLURM_BIN
    env: dict[str, str] = {}

    def run(self, argv: list[str], user: str = "root", timeout: float = 30) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if user != "root":
            cmd = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in self.env.items()), *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env},
                              cwd="/tmp")

    def start(self, conf: str, sc: dict) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        pass


class Slurm(System):
    name = "slurm"

    def start(self, conf: str, sc: dict) -> None:
        for user in ("root", *USERS):
            self.run(["scancel", "-u", user, "--full"])
        Path("/etc/slurm/slurm.conf").write_text(conf)
        pid = Path("/run/slurm/slurmctld.pid")
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
            _wait(lambda: not _alive(pid), 30, "slurmctld to stop")
        for f in ("assoc_usage", "qos_usage", "priority_last_decay_ran"):
            Path("/var/spool/slurmctld", f).unlink(missing_ok=True)
        self._reset_accounts()
        subprocess.run(["/usr/sbin/slurmctld", "-c", "-i"], check=True)
        _wait(lambda: set(self.run(["sinfo", "-h", "-o", "%t"]).stdout.split()) == {"idle"}, 90, "Slurm's nodes idle")
        for line in sc["sacctmgr"]:
            self.run(["sacctmgr", "-i", *line.split()])

    def _reset_accounts(self) -> None:
        out = self.run(["sacctmgr", "-n", "-P", "list", "account", "format=account"]).stdout.split()
        self.run(["sacctmgr", "-i", "delete", "user", ",".join(USERS)])
        others = [a for a in out if a != "root"]
        if others:
            self.run(["sacctmgr", "-i", "delete", "account", ",".join(others)])
        qos = self.run(["sacctmgr", "-n", "-P", "list", "qos", "format=name"]).stdout.split()
        extra = [q for q in qos if q != "normal"]
        if extra:
            self.run(["sacctmgr", "-i", "delete", "qos", ",".join(extra)])


class Rota(System):
    name = "rota"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.bin = ROTA_BIN
        self.procs: list[subprocess.Popen] = []
        self.env = {"ROTA_STATE_DIR": str(base / "state")}

    def start(self, conf: str, sc: dict) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
        self.base.mkdir(parents=True)
        self.base.chmod(0o755)
        (self.base / "slurm.conf").write_text(for_rota(conf))
        env = {**os.environ, **self.env}
        log = open(self.base / "up.log", "w")
        self.procs = [subprocess.Popen([str(self.bin / "rota"), "up", "--no-agent", "--config",
                                        str(self.base / "slurm.conf"), "--kill-wait", "2", "--node-timeout", "60"],
                                       env=env, stdout=log, stderr=subprocess.STDOUT)]
        state = self.base / "state"
        _wait(lambda: (state / "cluster.json").exists(), 60, "rota up")
        url = json.loads((state / "cluster.json").read_text())["nats"]
        for i in range(1, 5):
            node = f"gpu{i:02d}"
            key = self.base / f"{node}.key"
            subprocess.run([str(self.bin / "rota"), "keygen", "--host", node, "--out", str(key)], env=env,
                           check=True, capture_output=True)
            self.procs.append(subprocess.Popen(
                [str(self.bin / "rota"), "agent", "--node", node, "--nats", url, "--key", str(key), "--state-dir",
                 str(self.base / node), "--fake-gpus", "a100:8", "--cpus", "64", "--memory", "257000", "--socket",
                 str(self.base / f"{node}.sock"), "--heartbeat", "2", "--kill-wait", "2"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        _wait(lambda: set(self.run(["sinfo", "-h", "-o", "%T %D"]).stdout.splitlines()) == {"idle 4"}, 90,
              "rota's nodes idle")
        for line in sc["sacctmgr"]:
            self.run(["sacctmgr", "-i", *line.split()])

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGINT if p is self.procs[0] else signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def _wait(ok, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if ok():
            return
        time.sleep(0.5)
    raise SystemExit(f"parity: timed out waiting for {what}")


class Observer:
    """What one system showed: each job's start (from squeue's %S), its reasons at the checks, sprio and
    squeue --start at the checks."""

    def __init__(self, system: System, t0: float) -> None:
        self.system, self.t0 = system, t0
        self.starts: dict[str, float] = {}
        self.checks: dict[str, dict[str, Any]] = {}
        self.ids: dict[str, str] = {}           # job id -> the scenario's key for it

    def key(self, jid: str, array: str, name: str) -> str:
        if jid in self.ids:
            return self.ids[jid]
        k = name + jid[len(array):] if "_" in jid and jid.startswith(array) else name
        self.ids[jid] = k = same_name(k, self.ids.values())
        return k

    def poll(self) -> list[list[str]]:
        rows = [ln.split("|") for ln in self.system.run(["squeue", "-h", "-a", "-o", QUEUE]).stdout.splitlines()]
        for jid, array, name, state, _reason, start in (r for r in rows if len(r) == 6):
            k = self.key(jid, array, name)
            if state in ("RUNNING", "COMPLETING") and k not in self.starts:
                self.starts[k] = _moment(start, self.t0)
        return rows

    def check(self, at: int) -> None:
        rows = self.poll()
        reasons = {self.ids[r[0]]: r[4] for r in rows if len(r) == 6 and r[3] == "PENDING"}
        prio: dict[str, list[int]] = {}
        for line in self.system.run(["sprio", "-h", "-o", SPRIO]).stdout.splitlines():
            f = line.split("|")
            if len(f) == 8 and f[0].strip() in self.ids:
                prio[self.ids[f[0].strip()]] = [_int(v) for v in f[1:]]
        expected = {}
        for line in self.system.run(["squeue", "-h", "-a", "--start", "-t", "PD", "-o", "%i|%S"]).stdout.splitlines():
            jid, _, start = line.partition("|")
            if jid in self.ids and start not in ("N/A", ""):
                expected[self.ids[jid]] = _moment(start, self.t0)
        nodes = dict(ln.split("|", 1) for ln in self.system.run(["sinfo", "-h", "-N", "-o", "%N|%t"]).stdout.split()
                     if "|" in ln)
        self.checks[str(at)] = {"reasons": reasons, "sprio": prio, "expected": expected, "nodes": nodes}

    def result(self) -> dict:
        return {"starts": self.starts, "checks": self.checks}


def same_name(key: str, taken: Any) -> str:
    """A second job of a name (a singleton dependency's) is ``NAME#2``, a third ``NAME#3``: ids go in submit order."""
    n, k = 1, key
    while k in taken:
        n += 1
        k = f"{key}#{n}"
    return k


def _moment(text: str, t0: float) -> float:
    try:
        return round(datetime.fromisoformat(text).timestamp() - t0, 1)
    except ValueError:
        return -1.0


def _int(text: str) -> int:
    try:
        return int(float(text.strip()))
    except ValueError:
        return 0


def run(sc: dict, systems: list[System], base: str) -> dict[str, dict]:
    """Run a scenario on every system at once (``base``: the slurm.conf both start from); what each showed."""
    conf = scenario_conf(base, sc)
    for s in systems:
        s.start(conf, sc)
    t0 = time.time()
    obs = {s.name: Observer(s, t0) for s in systems}
    steps = sorted([(j["at"], 0, j) for j in sc["job"]] + [(d["at"], 1, d) for d in sc["do"]] +
                   [(c, 2, None) for c in sc["checks"]], key=lambda x: (x[0], x[1]))
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            for o in obs.values():
                o.poll()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ids: dict[str, dict[str, str]] = {s.name: {} for s in systems}     # per system: a job's name -> its id
    flip = False
    for at, kind, item in steps:
        delay = t0 + at - time.time()
        if delay > 0:
            time.sleep(delay)
        order = systems[::-1] if flip else systems
        flip = not flip
        for s in order:
            if kind == 0:
                _submit(s, item, ids[s.name])
            elif kind == 1:
                s.run(with_ids(item["command"], ids[s.name]))
            else:
                obs[s.name].check(at)
    time.sleep(max(0.0, t0 + sc.get("length", 120) - time.time()))
    stop.set()
    watcher.join()
    return {name: o.result() for name, o in obs.items()}


def with_ids(argv: list[str], ids: dict[str, str]) -> list[str]:
    """``argv`` with each ``{NAME}`` replaced by the id the job of that name got (dependencies, holds)."""
    return [re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), m.group(0)), a) for a in argv]


def _submit(s: System, job: dict, ids: dict[str, str]) -> None:
    argv = ["sbatch", "--parsable", "-J", job["name"], "-o", "/dev/null", *with_ids(job.get("args", []), ids),
            "--wrap", f"sleep {job.get('run', 30)}"]
    out = s.run(argv, job.get("user", "alice"))
    if out.returncode:
        print(f"  {s.name}: {job['name']} refused: {out.stderr.strip()}", file=sys.stderr)
    else:
        ids[job["name"]] = out.stdout.strip().split(";")[0]


def compare(sc: dict, slurm: dict, rota: dict, slack: float) -> dict[str, Any]:
    """The differences and the counts: decisions (each job's start), reasons and sprio factors at the checks."""
    rows: list[tuple[str, str, str, str]] = []
    names = [j["name"] for j in sc["job"]]
    keys = sorted(set(slurm["starts"]) | set(rota["starts"]) | set(names), key=lambda k: (names.index(k.split("_")[0])
                                                                                     if k.split("_")[0] in names else 99, k))
    same = total = 0
    for k in keys:
        a, b = slurm["starts"].get(k), rota["starts"].get(k)
        total += 1
        if (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= slack):
            same += 1
        else:
            rows.append(("start", k, _t(a), _t(b)))
    r_same = r_total = f_same = f_total = 0
    for at, sl in slurm["checks"].items():
        ro = rota["checks"].get(at, {"reasons": {}, "sprio": {}})
        for k in sorted(set(sl["reasons"]) | set(ro["reasons"])):
            r_total += 1
            if sl["reasons"].get(k) == ro["reasons"].get(k):
                r_same += 1
            else:
                rows.append((f"reason@{at}", k, sl["reasons"].get(k, "-"), ro["reasons"].get(k, "-")))
        for k in sorted(set(sl["sprio"]) & set(ro["sprio"])):
            for name, x, y in zip(FACTORS, sl["sprio"][k], ro["sprio"][k]):
                f_total += 1
                if abs(x - y) <= 1:
                    f_same += 1
                else:
                    rows.append((f"sprio {name}@{at}", k, str(x), str(y)))
    n_same, n_total = _node_states(slurm, rota, rows)
    return {"decisions": (same, total), "reasons": (r_same, r_total), "factors": (f_same, f_total),
            "nodes": (n_same, n_total), "rows": rows}


def _node_states(slurm: dict, rota: dict, rows: list) -> tuple[int, int]:
    """How many node states (sinfo's %t: idle, mix, plnd, mix-...) were the same at the checks."""
    same = total = 0
    for at, sl in slurm["checks"].items():
        ro = rota["checks"].get(at, {}).get("nodes", {})
        for node, state in sorted(sl.get("nodes", {}).items()):
            total += 1
            if ro.get(node) == state:
                same += 1
            else:
                rows.append((f"node@{at}", node, state, ro.get(node, "-")))
    return same, total


def _t(v: float | None) -> str:
    return "never" if v is None else f"{v:.0f}s"


def report(name: str, cmp: dict[str, Any]) -> None:
    d, r, f, n = cmp["decisions"], cmp["reasons"], cmp["factors"], cmp["nodes"]
    print(f"{name}: decisions {d[0]}/{d[1]}, reasons {r[0]}/{r[1]}, sprio factors {f[0]}/{f[1]}, "
          f"node states {n[0]}/{n[1]}")
    if cmp["rows"]:
        print(f"  {'what':<22}{'job':<14}{'slurm':<44}rota")
        for what, k, a, b in cmp["rows"]:
            print(f"  {what:<22}{k:<14}{a[:42]:<44}{b}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="parity", description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", help="scenario files (default: every one in tests/fixtures/parity)")
    ap.add_argument("--record", action="store_true", help="keep Slurm's observations beside each scenario")
    ap.add_argument("--slack", type=float, default=5.0, help="seconds two starts may differ and be the same")
    ap.add_argument("--out", help="a new directory for both systems' observations (default: a fresh one in the "
                                  "temporary directory)")
    a = ap.parse_args(argv)
    if not (SLURM_BIN / "slurmctld").exists() and not Path("/usr/sbin/slurmctld").exists():
        print("parity: no Slurm on this machine: run ops/slurm/setup.sh first (WITH_DBD=1 for accounts)")
        return 2
    for user, uid in USERS.items():
        if subprocess.run(["/usr/bin/id", user], capture_output=True).returncode:
            subprocess.run(["/usr/sbin/useradd", "-m", "-u", str(uid), "-s", "/bin/bash", user], check=True)
    paths = [Path(p) for p in a.scenarios] or sorted(SCENARIOS.glob("*.toml"))
    # root writes /etc/slurm/slurm.conf back from this directory: never one another user made or could change
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="rota-parity-"))
    if a.out:
        out.mkdir(mode=0o700)
    out.chmod(0o755)            # the users' commands reach rota's socket under it
    print(f"parity: observations in {out}")
    host = os.uname().nodename.split(".")[0]
    totals = [0] * 8
    rota = Rota(out / "rota")
    kept = out / "slurm.conf.setup"        # Slurm's file as its setup wrote it: each scenario starts from it
    shutil.copy("/etc/slurm/slurm.conf", kept)
    base = base_conf(host, kept.read_text())
    try:
        for path in paths:
            sc = load(path)
            seen = run(sc, [Slurm(), rota], base)
            rota.stop()
            (out / f"{sc['name']}.json").write_text(json.dumps(seen, indent=1, sort_keys=True))
            if a.record:
                path.with_suffix(".slurm.json").write_text(json.dumps(seen["slurm"], indent=1, sort_keys=True) + "\n")
            cmp = compare(sc, seen["slurm"], seen["rota"], a.slack)
            report(sc["name"], cmp)
            for i, k in enumerate(("decisions", "reasons", "factors", "nodes")):
                totals[2 * i] += cmp[k][0]
                totals[2 * i + 1] += cmp[k][1]
    finally:
        rota.stop()
        shutil.copy(kept, "/etc/slurm/slurm.conf")
    print(f"all: decisions {totals[0]}/{totals[1]}, reasons {totals[2]}/{totals[3]}, "
          f"sprio factors {totals[4]}/{totals[5]}, node states {totals[6]}/{totals[7]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
