"""A real Slurm 22.05's decisions in the parity scenarios (``bench/parity.py --record`` kept them beside each
scenario), replayed through rota's core: the same starts, the same reasons and ``sprio`` factors at each check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rota.bench.parity import FACTORS, SCENARIOS, for_rota, load, over, same_name, with_ids
from rota.cli.sacctmgr import parse as sacctmgr_line
from rota.cli.sbatch import build_spec
from rota.core import accounting, commands
from rota.core import events as ev
from rota.core.auth import Caller
from rota.core.schedule import factors_of, schedule
from rota.core.sim import Action, Simulator, TraceJob
from rota.core.slurmconf import parse_config
from rota.core.timetravel import replay_to

UIDS = {"alice": 2001, "bob": 2002, "carol": 2003}
RECORDED = sorted(p for p in SCENARIOS.glob("*.toml") if p.with_suffix(".slurm.json").exists())
SLACK = 5          # seconds: Slurm's backfill runs every bf_interval, its launches take a moment


def replay(path: Path, reserve: str = "nodes") -> tuple[dict, dict, object]:
    """The scenario, what Slurm showed, and rota's simulation of it (``reserve``: rota_reserve's value)."""
    sc = load(path)
    text = for_rota(over((SCENARIOS / "base.conf").read_text(), sc.get("conf", "")))
    text = text.replace("rota_reserve=nodes", f"rota_reserve={reserve}")
    config = parse_config(text, str(path))
    sim = Simulator(config)
    for line in sc["sacctmgr"]:
        _, op, entity, names, where, values, _ = sacctmgr_line(line.split())
        sim.timeline.put(0, accounting.plan(sim.state, op, entity, names, where, values, by="root"), "root")
    jobs = []
    # the simulator numbers jobs from 1 in the order they arrive
    order = sorted(range(len(sc["job"])), key=lambda i: (sc["job"][i]["at"], i))
    ids = {sc["job"][i]["name"]: str(n) for n, i in enumerate(order, 1)}
    for i, j in enumerate(sc["job"]):
        spec, _ = build_spec(["-J", j["name"], *with_ids(j.get("args", []), ids), "--wrap",
                              f"sleep {j.get('run', 30)}"], now=j["at"])
        spec = {k: v for k, v in spec.items() if not k.startswith("_")}
        user = j.get("user", "alice")
        caller = Caller(UIDS[user], UIDS[user], user)
        # checked here as sbatch's request is (its dependencies' jobs exist only once the simulation runs)
        dependency = spec.pop("dependency", None)
        job = commands.submit(sim.state, ev.JobSpec(**spec, user=user, uid=UIDS[user], gid=UIDS[user]), 0,
                              caller).spec
        jobs.append(TraceJob(j["at"], job.model_copy(update={"dependency": dependency}), j.get("run", 30), i))
    result = sim.run(jobs, actions=[Action(d["at"], _action(with_ids(d["command"], ids))) for d in sc["do"]])
    return sc, json.loads(path.with_suffix(".slurm.json").read_text()), result


def _action(argv: list[str]):
    """An administrator's command of a scenario as the event it makes (the node commands the scenarios use)."""
    if argv[:2] in (["scontrol", "release"], ["scontrol", "hold"]):
        job = int(argv[2])
        return lambda st: (commands.release if argv[1] == "release" else commands.hold)(st, job)
    words = dict(w.split("=", 1) for w in argv[2:] if "=" in w)
    if argv[:2] != ["scontrol", "update"] or "NodeName" not in words:
        pytest.fail(f"the replay cannot carry out {' '.join(argv)}")
    node, state = words["NodeName"], words.get("State", "").upper()
    if state == "DRAIN":
        return lambda st: commands.drain(st, node, words.get("Reason", ""))
    if state == "DOWN":
        return lambda st: commands.down(st, node, words.get("Reason", ""))
    if state == "RESUME":
        return lambda st: commands.resume(st, node)
    pytest.fail(f"the replay cannot carry out {' '.join(argv)}")


def started(result) -> tuple[dict[int, str], dict[str, int]]:
    """The jobs' names by id, and each job's (each array task's) first start, named as the harness names it."""
    names: dict[int, str] = {}
    starts: dict[str, int] = {}
    for env in result.log:
        e = env.event
        if isinstance(e, ev.JobSubmitted):
            names[e.job_id] = same_name(e.spec.name, names.values())
        elif isinstance(e, ev.JobsStarted):
            for s in e.starts:
                key = names[s.array_job_id if s.array_job_id is not None else s.job_id]
                starts.setdefault(key if s.array_task_id is None else f"{key}_{s.array_task_id}", env.ts)
    return names, starts


@pytest.mark.skipif(not RECORDED, reason="no scenario has Slurm's observations recorded")
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_rota_decides_as_the_real_slurm_did(path):
    sc, slurm, result = replay(path)
    names, starts = started(result)
    differ = {k: (slurm["starts"].get(k), starts.get(k)) for k in set(slurm["starts"]) | set(starts)
              if slurm["starts"].get(k) is None or starts.get(k) is None
              or abs(slurm["starts"][k] - starts[k]) > SLACK}
    assert not differ, f"starts (slurm, rota) that differ: {differ}"
    by_name = {name: jid for jid, name in names.items()}
    for at, seen in slurm["checks"].items():
        state = replay_to(result.log, at_time=int(at))
        d = schedule(state, int(at))
        reasons = {k: p.display for k in seen["reasons"] if (p := d.pending_of(by_name[k.split("_[")[0]]))}
        assert reasons == seen["reasons"], f"reasons at {at}s"
        factors = factors_of(state, int(at), [by_name[k.split("_")[0]] for k in seen["sprio"]])
        for k, values in seen["sprio"].items():
            mine = factors[by_name[k.split("_")[0]]][1]
            ours = [mine.priority, mine.age, mine.fairshare, mine.job_size, mine.partition, mine.qos, mine.nice]
            off = {f: (x, y) for f, x, y in zip(FACTORS, values, ours) if abs(x - y) > 1}
            assert not off, f"sprio of {k} at {at}s (slurm, rota): {off}"


def test_rotas_finer_reservations_start_the_cpu_job_beside_the_planned_one_and_delay_nobody():
    path = SCENARIOS / "planned.toml"
    _, slurm, whole = replay(path, reserve="nodes")
    _, _, finer = replay(path, reserve="resources")
    (_, as_slurm), (_, mine) = started(whole), started(finer)
    assert abs(as_slurm["cpus"] - slurm["starts"]["cpus"]) <= SLACK       # Slurm kept the planned node whole
    assert mine["cpus"] == 8          # at the next backfill moment (bf_interval=2), on CPUs nobody plans for
    assert mine["gpus"] == as_slurm["gpus"] and mine["fill"] == as_slurm["fill"]      # nobody started later
