"""Memory with a deep queue: `rota up`'s resident memory with 10,000 / 100,000 (/ 1,000,000) pending jobs.

    python -m rota.bench.memory_bench [--levels 10000,100000] [--kinds alike,distinct]

This machine, as one node, is filled by a job that sleeps; every other job asks one CPU and waits, so every job stays
pending in every state `rota up` folds (the controller's, the projection's, its reason history's, the
notifier's). The queue is filled through `Client.submit_many` with the submitting shell's environment:
``alike`` jobs are the same command (a sweep of one script, or one loop's submits), ``distinct`` jobs each
have a command line and script of their own. Memory is read from /proc once every state has folded the
last submit and the figure has settled; per pending job it is the growth over the one running job.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time

from .common import Figure, print_table, stop, write_json
from .queue_bench import BATCH, rss_mib, start_queue

TARGET_KIB = 4.0          # per pending job


def settled_rss(pid: int, quiet: float = 6.0, most: float = 300.0) -> float:
    """The process's RSS once it has stopped growing for ``quiet`` seconds (its followers caught up)."""
    end = time.monotonic() + most
    last, since = rss_mib(pid), time.monotonic()
    while time.monotonic() < end:
        time.sleep(1.0)
        now = rss_mib(pid)
        if now > last + 1.0:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return rss_mib(pid)


def one_kind(levels: list[int], distinct: bool) -> dict[int, tuple[float, float]]:
    """{pending: (RSS MiB, KiB per pending job)} for one kind of queue."""
    base, _env, up, client = start_queue("rota-memory-", "--web-port", "0")
    out: dict[int, tuple[float, float]] = {}
    try:
        floor = settled_rss(up.pid)
        submitted = 1
        for level in levels:
            while submitted < level:
                k = min(BATCH, level - submitted)
                wraps = [f"true {submitted + i}" for i in range(k)] if distinct else ["true"] * k
                taken = len(client.submit_many(wraps, options=["-o", "/dev/null"]))
                if taken < k:
                    raise RuntimeError(f"{k - taken} of {k} submits refused at {submitted:,} jobs")
                submitted += k
            rss = settled_rss(up.pid)
            pending = client._call("ping", {}).get("pending")
            if pending != level - 1:
                raise RuntimeError(f"{pending} jobs pending where {level - 1:,} should be")
            out[level] = (rss, (rss - floor) * 1024 / (level - 1))
            print(f"{'distinct' if distinct else 'alike'} {level:>8,} pending: {rss:,.0f} MiB "
                  f"({out[level][1]:.2f} KiB a job)", file=sys.stderr, flush=True)
    finally:
        stop(up, 120)
        shutil.rmtree(base, ignore_errors=True)
    return out


def run(levels: list[int], kinds: list[str]) -> list[Figure]:
    cmd = f"python -m rota.bench.memory_bench --levels {','.join(map(str, levels))} --kinds {','.join(kinds)}"
    figures = []
    for kind in kinds:
        for level, (rss, per_job) in one_kind(levels, kind == "distinct").items():
            figures.append(Figure(f"rota up memory, {level:,} pending ({kind})", rss, "MiB", "", None, cmd))
            gated = level >= 100_000     # below, what a process holds anyway weighs on each job
            figures.append(Figure(f"  the same, per pending job ({kind})", per_job, "KiB",
                                  f"<= {TARGET_KIB:g} KiB" if gated else "", per_job <= TARGET_KIB if gated else None,
                                  cmd))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="10000,100000")
    ap.add_argument("--kinds", default="alike,distinct")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run([int(x) for x in args.levels.split(",")], args.kinds.split(","))
    print_table(figures, "memory with a deep queue")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
