"""Hostile input, counted: every API verb, the agents' inbox, sbatch command lines and scripts, and
configuration files, each fed thousands of generated inputs (hypothesis). Each input must get exactly
one clear answer (an API reply, a refusal, an error line), never a traceback.

    python -m rota.bench.fuzz_bench [--examples 10000]

The test suite runs the same checks with fewer examples (tests/test_fuzz.py).
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from rota.core import events as ev

T = 1_800_000_000


@dataclass
class Tally:
    inputs: int = 0
    tracebacks: int = 0
    missing_replies: int = 0
    examples: list[str] = field(default_factory=list)

    def bad(self, kind: str, what: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 5:
            self.examples.append(what[:300])


# ---------------------------------------------------------------- strategies

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=20)
_FIELDS = ["job_id", "tasks", "signal", "spec", "node", "reason", "time_limit", "priority", "nice", "user_hold", "hold",
           "command", "argv", "jobs", "users", "format", "Format", "me", "states", "partitions"]
_SPEC = st.dictionaries(st.sampled_from(sorted(set(ev.JobSpec.model_fields) - {"user", "uid", "gid"})),
                        JSON | st.integers(-2**70, 2**70), max_size=8)
BODIES = st.one_of(
    JSON.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(_FIELDS), JSON | st.integers(-2**70, 2**70), max_size=5).map(
        lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"spec": _SPEC}).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"command": st.sampled_from(["sacct", "sinfo", "scontrol", "why", "replay", "x"]),
                           "argv": st.lists(st.text(max_size=12), max_size=5)}).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=300),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 5000).map(lambda n: b'{"spec":' * n + b"{}" + b"}" * n),
)

_OPTIONS = ["-N", "-n", "-c", "--mem", "--mem-per-cpu", "--gres", "--gpus", "-t", "--time", "-p", "-J", "-o", "-e",
            "-a", "--array", "-d", "--dependency", "-b", "--begin", "-H", "-w", "-x", "--wrap", "--parsable",
            "--test-only", "--nice", "--exclusive", "--export", "-A", "-q", "-C", "--ntasks-per-node", "--mail-type",
            "--uid", "--tim", "--n", "--", "-", "-Hx", "--help", "--version", "--gres=gpu:", "--mem=", "-t="]
_VALUES = st.one_of(st.sampled_from(["1", "0", "-1", "gpu:a100:2", "gpu:9", "16G", "1-0", "5:00", "UNLIMITED",
                                     "now+1hour", "teatime", "0-3%2", "afterok:1", "n[1-3]", "x" * 300, "9" * 40,
                                     "²", "١٢", "'", '"', "\x00", "\x1b[2J", "%999999999j", "ALL", "NONE"]),
                    st.text(max_size=12))
ARGV = st.lists(st.one_of(st.sampled_from(_OPTIONS), _VALUES), max_size=8)
_LINES = st.one_of(st.builds(lambda o, v: f"#SBATCH {o} {v}", st.sampled_from(_OPTIONS), _VALUES),
                   st.sampled_from(["#SBATCH --job-name='unbalanced", '#SBATCH -J "a b', "#SBATCH", "#!", "echo hi",
                                    "", "# comment", "#SBATCH --wrap=x", "\r"]),
                   st.text(max_size=30))
SCRIPTS = st.one_of(
    st.lists(_LINES, max_size=8).map(lambda ls: ("#!/bin/sh\n" + "\n".join(ls) + "\n").encode()),
    st.binary(max_size=200),
    st.lists(_LINES, max_size=5).map(lambda ls: b"#!/bin/sh\n" + "\n".join(ls).encode() + b"\n\xff\xfe\n"),
)

_CONF_LINES = st.one_of(
    st.builds(lambda a, b: f"NodeName={a} CPUs={b} RealMemory={b} Gres=gpu:a100:{b}",
              st.sampled_from(["gpu[01-04]", "n1", "x[", "[1-99999]", "a,b", "n[1-3]"]), _VALUES),
    st.builds(lambda a, b: f"PartitionName={a} Nodes={b} Default=YES MaxTime={b}",
              st.sampled_from(["p", "short", "x y"]), _VALUES),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["GresTypes", "SchedulerType", "SchedulerParameters",
                                                          "PriorityWeightAge", "MaxArraySize", "MinJobAge",
                                                          "EnforcePartLimits", "AdminUsers", "AuthInfo", "PrivateData",
                                                          "PriorityMaxAge", "Bogus", "RotaTLSCertFile"]), _VALUES),
    st.sampled_from(["\\", "'unclosed", 'x="', "NodeName=DEFAULT CPUs=4", "Include x", "#", "=", "==="]),
    st.text(max_size=40),
)
CONFIGS = st.one_of(st.lists(_CONF_LINES, max_size=8).map("\n".join), st.text(max_size=200))
_GOOD = ("GresTypes=gpu\nNodeName=gpu[01-02] CPUs=8 RealMemory=16000 Gres=gpu:a100:4\n"
         "PartitionName=short Nodes=gpu[01-02] Default=YES MaxTime=1:00:00\n")
MANGLED = st.builds(lambda pos, junk: _GOOD[:pos] + junk + _GOOD[pos:], st.integers(0, len(_GOOD)), st.text(max_size=6))

REPORTS = st.one_of(
    st.sampled_from([ev.JobExited(job_id=1, state="COMPLETED", node="gpu01"), ev.HealthFault(node="gpu01", reason="x"),
                     ev.NodeRegistered(node="gpu01", cpus=8, memory=16000), ev.NodeRegistered(node="gpu02", cpus=-1,
                     memory=0), ev.JobSubmitted(job_id=5, spec=ev.JobSpec(uid=0)), ev.NodeDrained(node="gpu01",
                     reason="x")]).map(lambda e: ev.EVENT_ADAPTER.dump_json(e)),
    BODIES,
)


# ---------------------------------------------------------------- the surfaces


def _fuzzing(examples: int):
    """hypothesis, generating ``examples`` inputs (no shrinking, no database: every input is counted)."""
    return settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


class _Msg:
    def __init__(self, subject, data, headers, reply="_INBOX.fuzz"):
        self.subject, self.data, self.headers, self.reply = subject, data, headers, reply

        class _Meta:
            timestamp = None
            num_delivered = 1

            class sequence:  # the shape nats-py gives
                stream = 1
        self.metadata = _Meta()


async def _controller():
    from rota.controller.eventlog import MemoryLog
    from rota.controller.outbox import Outbox
    from rota.controller.service import Controller
    from rota.core.slurmconf import make_cluster
    from rota.wire.keys import Keyring

    keyring = Keyring(cluster_key=b"f" * 64)
    c = Controller(MemoryLog(), config=make_cluster(nodes=2, gpus=4), clock=lambda: T, keyring=keyring,
                   outbox=Outbox())
    await c.start()
    await c.handle("submit", {"spec": {"time_limit": 60, "hold": True}})
    return c, keyring


def api_surface(examples: int) -> Tally:
    """Every verb of the front door: signed requests with generated bodies; one reply each, no traceback."""
    from rota.agents.signer import Signer
    from rota.controller.verbs import VERBS

    tally = Tally()
    c, keyring = asyncio.run(_controller())
    signer = Signer("/nonexistent", "gpu01", keyring, None, clock=lambda: T)
    replies: list = []

    async def reply(subject, data):
        replies.append(data)

    c.nc_reply = reply
    counter = [0]

    @_fuzzing(examples)
    @given(verb=st.sampled_from(sorted(VERBS) + ["nope", "x" * 40]), body=BODIES, uid=st.sampled_from([0, 65534]))
    def one(verb, body, uid):
        counter[0] += 1
        rid = f"f{counter[0]}"
        subject = f"rota.api.{verb}"
        headers = {"Rota-Cred": signer.sign(subject, rid, body, uid, uid), "Rota-Rid": rid}
        replies.clear()
        tally.inputs += 1
        try:
            asyncio.run(c.frontdoor.on_message(_Msg(subject, body, headers)))
        except BaseException as exc:  # noqa: BLE001 - counted
            tally.bad("tracebacks", f"{verb} {body[:80]!r}: {type(exc).__name__}: {exc}")
            return
        if len(replies) != 1:
            tally.bad("missing_replies", f"{verb} {body[:80]!r}")
            return
        answer = json.loads(replies[0])
        if answer.get("rid") != rid or answer.get("code") == "internal":
            tally.bad("tracebacks", f"{verb} {body[:80]!r}: {answer}")

    one()
    return tally


def inbox_surface(examples: int) -> Tally:
    """The agents' inbox: generated reports, with and without the node's credential."""
    from rota.controller.agentlink import AgentLink
    from rota.core import credentials

    tally = Tally()
    c, keyring = asyncio.run(_controller())

    class _Nc:
        def jetstream(self, **_kw):
            return None

    link = AgentLink(c, _Nc(), keyring=keyring)

    @_fuzzing(examples)
    @given(body=REPORTS, node=st.sampled_from(["gpu01", "gpu02", "nope", "a.b"]), signed=st.booleans(),
           nonce=st.binary(min_size=16, max_size=16))
    def one(body, node, signed, nonce):
        subject = f"rota.inbox.{node}"
        headers = {"Nats-Msg-Id": nonce.hex()}
        if signed and credentials.valid_host(node.split(".")[0]):
            headers["Rota-Cred"] = credentials.issue(keyring.key_of(node), "node", 0, 0, node, int(time.time()),
                                                     nonce.hex(), subject, body)
        tally.inputs += 1
        try:
            asyncio.run(link._take(_Msg(subject, body, headers)))
        except BaseException as exc:  # noqa: BLE001 - counted
            tally.bad("tracebacks", f"{node} {body[:80]!r}: {type(exc).__name__}: {exc}")

    one()
    return tally


def sbatch_surface(examples: int) -> Tally:
    """sbatch's command line and script: each ends in a job spec or one error, never a traceback."""
    tally = Tally()
    tmp = tempfile.mkdtemp(prefix="rota-fuzz-")
    before = os.environ.get("ROTA_SOCKET")
    os.environ["ROTA_SOCKET"] = os.path.join(tmp, "no.sock")   # nothing to submit to: the client's own checks
    try:
        _sbatch_examples(examples, tally, tmp)
    finally:        # what runs after (the other benchmarks of `make bench`) submits to a real rota again
        if before is None:
            os.environ.pop("ROTA_SOCKET", None)
        else:
            os.environ["ROTA_SOCKET"] = before
        shutil.rmtree(tmp, ignore_errors=True)
    return tally


def _sbatch_examples(examples: int, tally: Tally, tmp: str) -> None:
    """Run sbatch on each generated command line and script, in ``tmp``, counting into ``tally``."""
    from rota.cli import sbatch

    @_fuzzing(examples)
    @given(argv=ARGV, script=SCRIPTS, with_script=st.booleans())
    def one(argv, script, with_script):
        path = os.path.join(tmp, "job.sh")
        with open(path, "wb") as fh:
            fh.write(script)
        args = [*argv, path] if with_script else argv
        tally.inputs += 1
        out, err = io.StringIO(), io.StringIO()
        stdin, sys.stdin = sys.stdin, io.TextIOWrapper(io.BytesIO(script))   # no script named: it is read here
        try:
            with redirect_stdout(out), redirect_stderr(err):
                code = sbatch.main(args)
        except BaseException as exc:  # noqa: BLE001 - counted
            tally.bad("tracebacks", f"{args!r}: {type(exc).__name__}: {exc}")
            return
        finally:
            sys.stdin = stdin
        if code not in (0, 1, 255) or (code != 0 and not err.getvalue().strip()):
            tally.bad("tracebacks", f"{args!r}: exit {code} without an error line")

    one()


def config_surface(examples: int) -> Tally:
    """Configuration files: a configuration or diagnostics with file:line, never a traceback; the same bytes
    through ``rota config check`` as a user runs it (one line, an exit status)."""
    import click

    from rota.cli.main import app
    from rota.core.slurmconf import check_config, shell_settings
    from rota.wire.paths import read_text

    tally = Tally()
    tmp = tempfile.mkdtemp(prefix="rota-fuzz-")

    @_fuzzing(examples)
    @given(text=st.one_of(CONFIGS, MANGLED), raw=st.binary(max_size=60), gres=st.one_of(st.none(), CONFIGS))
    def one(text, raw, gres):
        tally.inputs += 1
        try:
            cfg, diags = check_config(text, "slurm.conf", gres, "gres.conf")
            shell_settings(text)
            if cfg is None and not diags:
                tally.bad("tracebacks", f"{text!r}: refused without a diagnostic")
            path = os.path.join(tmp, "slurm.conf")
            with open(path, "wb") as fh:
                fh.write(text.encode("utf-8", "surrogateescape")[:40] + raw)
            try:
                check_config(read_text(path), path)
            except ValueError as exc:
                if "not UTF-8" not in str(exc):
                    raise
            err = io.StringIO()
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                try:
                    app(["config", "check", path], standalone_mode=False)
                except (SystemExit, click.exceptions.Exit):
                    pass
            if "Traceback" in err.getvalue():
                tally.bad("tracebacks", f"rota config check {raw!r}: {err.getvalue()[-200:]}")
        except BaseException as exc:  # noqa: BLE001 - counted
            tally.bad("tracebacks", f"{text!r}: {type(exc).__name__}: {exc}")

    try:
        one()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tally


SURFACES = {"API verbs": api_surface, "agents' inbox": inbox_surface, "sbatch command lines and scripts":
            sbatch_surface, "configuration files": config_surface}


def run(examples: int) -> list:
    """Each surface's tracebacks and missing replies as benchmark figures (target: none)."""
    import logging

    from .common import Figure

    logging.disable(logging.CRITICAL)
    figures = []
    try:
        for name, fn in SURFACES.items():
            tally = fn(examples)
            bad = tally.tracebacks + tally.missing_replies
            figures.append(Figure(f"fuzzed {name}: tracebacks or missing replies in {tally.inputs:,} inputs", bad,
                                  "", "0", bad == 0, f"python -m rota.bench.fuzz_bench --examples {examples}",
                                  "; ".join(tally.examples)))
    finally:
        logging.disable(logging.NOTSET)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=10_000, help="generated inputs per surface")
    args = ap.parse_args()
    import logging

    logging.disable(logging.CRITICAL)   # refusals are logged by design; the tally is what counts
    print(f"{'surface':<36} {'inputs':>8} {'tracebacks':>11} {'no reply':>9} {'seconds':>8}")
    failed = False
    for name, fn in SURFACES.items():
        t0 = time.perf_counter()
        tally = fn(args.examples)
        print(f"{name:<36} {tally.inputs:>8,} {tally.tracebacks:>11} {tally.missing_replies:>9} "
              f"{time.perf_counter() - t0:>8.1f}", flush=True)
        for example in tally.examples:
            print(f"    e.g. {example}")
        failed = failed or bool(tally.tracebacks or tally.missing_replies)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
