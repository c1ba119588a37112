"""``rota why | replay | verify | whatif | history``: time travel over the log (a JSON-lines file or the cluster's)."""
from __future__ import annotations

import datetime as _dt
import functools
from typing import Any, Iterable

from rota.core import events as ev
from rota.core.hostlist import compress
from rota.core.liveness import DEFAULT_LATENCY
from rota.core.reasons import SENTENCES
from rota.core.timefmt import format_duration



def load_envelopes(log_file: str | None, nats: str | None) -> list[ev.Envelope]:
    """The whole log: from a JSON-lines file (``rota simulate --log``) or from the cluster."""
    if log_file:
        out = []
        with open(log_file, "rb") as fh:
            for n, line in enumerate(fh, start=1):
                if line.strip():
                    try:
                        out.append(ev.decode_envelope(line))
                    except ValueError as exc:
                        raise ValueError(f"{log_file}:{n}: not an event envelope ({str(exc).splitlines()[0]})") from None
        return out
    import asyncio

    from rota.controller.eventlog import JetStreamLog
    from rota.wire.cluster import admin_connection

    urls, options = admin_connection(nats)

    async def read() -> list[ev.Envelope]:
        lg = await JetStreamLog.connect(urls, **options)
        try:
            out: list[ev.Envelope] = []
            async for chunk in lg.read_batches(1):
                out.extend(chunk)
            return out
        finally:
            await lg.close()

    return asyncio.run(read())


def load_seek(nats: str | None, target_seq: int | None = None, target_time: int | None = None,
              to_seq: int | None = None):
    """The nearest history snapshot at or before a sequence (or time) and the envelopes after it: up
    to ``to_seq``, else up to the first one past ``target_time`` when that is given, else to the end."""
    import asyncio

    from rota.controller.eventlog import JetStreamLog
    from rota.wire.cluster import admin_connection

    urls, options = admin_connection(nats)

    async def read():
        import gc

        gc.disable()   # a short-lived process that allocates what it keeps: the collector only rescans it
        lg = await JetStreamLog.connect(urls, **options)
        try:
            state = None
            if target_seq is not None:
                state = await lg.snapshots.at_or_before(target_seq)
            elif target_time is not None:
                state = await lg.snapshots.at_or_before_time(target_time)
            out: list[ev.Envelope] = []
            async for chunk in lg.read_batches((state.seq if state else 0) + 1, to_seq):
                out.extend(chunk)
                if to_seq is None and target_time is not None and chunk[-1].ts > target_time:
                    break   # replay_to stops at the first event past the moment
            return state, out
        finally:
            await lg.close()

    return asyncio.run(read())


def forked_map(work: Any, n: int) -> list | None:
    """``[work(0, n), ..., work(n-1, n)]``, each computed in a forked copy of this process (they run on
    separate CPUs); None where fork is missing or a worker failed (the caller then works alone)."""
    import os
    import pickle

    if n < 2 or not hasattr(os, "fork"):
        return None
    import gc

    children: list[tuple[int, int]] = []
    results = []
    gc.freeze()   # the collector would otherwise touch, and so copy, every page the workers share
    try:
        for w in range(n):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:   # a worker: its own copy of everything the parent holds
                gc.disable()
                code = 1
                try:
                    os.close(read_end)
                    with os.fdopen(write_end, "wb") as out:
                        pickle.dump(work(w, n), out, protocol=pickle.HIGHEST_PROTOCOL)
                    code = 0
                finally:
                    os._exit(code)
            os.close(write_end)
            children.append((pid, read_end))
        while children:
            pid, read_end = children[0]
            with os.fdopen(read_end, "rb") as inp:
                data = inp.read()
            children.pop(0)
            _, status = os.waitpid(pid, 0)
            if status != 0 or not data:
                raise RuntimeError("a worker failed")
            results.append(pickle.loads(data))
        gc.unfreeze()
        return results
    except (OSError, RuntimeError, pickle.UnpicklingError):
        gc.unfreeze()
        for pid, read_end in children:
            try:
                os.close(read_end)
                os.waitpid(pid, 0)
            except OSError:
                pass
        return None


def workers() -> int:
    """How many processes to share time-travel work among (the CPUs, at most 4)."""
    import os

    return min(os.cpu_count() or 1, 4)


def explain(envelopes: list[ev.Envelope], job_id: int, at_seq: int | None, state: Any, n: int = 0):
    """``rota.core.timetravel.why`` with its moments shared out: the job's story is cut into ``n`` runs of
    about as many log records (:func:`story_runs`); forked workers (made before this process walks, so each starts from the
    same state) evaluate the moments of runs 2..n and stream each here as they make it, while this process
    walks once, evaluating the first run's and taking theirs. Each evaluates moments that follow one another,
    as one process does, so what one moment built serves the next. A worker that fails or falls out of step
    leaves its moments to this process. The report is the same as one process's."""
    from rota.core.timetravel import why

    n = n or workers()
    streams = MomentStreams(envelopes, job_id, at_seq, state, n) if len(envelopes) >= 2000 else None
    if streams is None or not streams.children:
        return why(envelopes, job_id, at_seq, state)
    try:
        return why(envelopes, job_id, at_seq, state, pick=streams.mine, others=streams.take)
    finally:
        streams.close()


def story_runs(envelopes: list[ev.Envelope], job_id: int, n: int) -> list[int]:
    """The log sequences that cut the story of ``job_id``, from its submit to its start, into ``n`` runs of as many
    records each (a moment costs more as the queue grows: records weigh its moments better than cycles do): run
    ``i`` holds the moments from the ``i``-th sequence on (the first run, those before the first)."""
    first, last = -1, len(envelopes)
    for i, env in enumerate(envelopes):
        e = env.event
        if first < 0:
            if isinstance(e, ev.JobSubmitted) and e.job_id == job_id:
                first = i
        elif isinstance(e, ev.JobsStarted) and any(s.job_id == job_id or s.array_job_id == job_id for s in e.starts):
            last = i + 1
            break
    first = max(first, 0)       # its submit not among them: the whole of them
    size = last - first
    return [envelopes[first + size * i // n].seq for i in range(1, n)] if size else []


class MomentStreams:
    """Workers 1..n-1 of :func:`explain`, each writing (key, sample) for the moments of its run down a pipe."""

    def __init__(self, envelopes: list[ev.Envelope], job_id: int, at_seq: int | None, state: Any, n: int) -> None:
        import os

        self.bounds = story_runs(envelopes, job_id, n) if n >= 2 else []
        self.children: list[tuple[int, Any]] = []     # (pid, the pipe's reading end)
        self.readers: list[Any] = []                  # the threads reading them
        self.taken: list[Any] = []                    # what each has sent, a queue (None once out of step)
        if n < 2 or not hasattr(os, "fork"):
            return
        for w in range(1, n):
            try:
                read_end, write_end = os.pipe()
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                self._work(read_end, write_end, envelopes, job_id, at_seq, state, w)
            os.close(write_end)
            self.children.append((pid, os.fdopen(read_end, "rb")))
        # each worker's evaluations are read as they come (a run's can outgrow a pipe long before this process
        # asks for the first), by threads started once no more forks are to come
        self.taken = [self._drain(inp) for _pid, inp in self.children]

    def _drain(self, inp: Any) -> Any:
        """A queue of what the worker behind ``inp`` sends, filled by a thread of its own; None ends it."""
        import pickle
        import queue
        import threading

        got: queue.SimpleQueue = queue.SimpleQueue()

        def read() -> None:
            try:
                while True:
                    got.put(pickle.load(inp))
            except Exception:  # noqa: BLE001 - the worker's end, or what it cannot send: its moments are made here
                got.put(None)
            finally:
                inp.close()

        reader = threading.Thread(target=read, name="moments", daemon=True)
        reader.start()
        self.readers.append(reader)
        return got

    def run_of(self, key: Any) -> int:
        """The run a moment belongs to (0: this process's)."""
        from bisect import bisect_right

        return bisect_right(self.bounds, key[0])

    def mine(self, key: Any) -> bool:
        return self.run_of(key) == 0

    def _work(self, read_end: int, write_end: int, envelopes: list[ev.Envelope], job_id: int, at_seq: int | None,
              state: Any, w: int) -> None:
        import gc
        import os
        import pickle

        from rota.core.timetravel import cycle_samples

        gc.disable()
        code = 1
        try:
            os.close(read_end)
            for _pid, inp in self.children:
                inp.close()
            stop_at = self.bounds[w] if w < len(self.bounds) else None
            with os.fdopen(write_end, "wb") as out:
                for item in cycle_samples(envelopes, job_id, at_seq, state, pick=lambda key: self.run_of(key) == w,
                                          stop_at=stop_at):
                    pickle.dump(item, out, protocol=pickle.HIGHEST_PROTOCOL)
                    out.flush()
            code = 0
        except BrokenPipeError:     # the walk ended before this worker's share did
            code = 0
        finally:
            os._exit(code)

    def take(self, key: Any) -> Any:
        """The evaluation of the moment of key ``key`` from its worker (MISSING when that worker cannot give it)."""
        from rota.core.timetravel import MISSING

        w = self.run_of(key) - 1
        if not 0 <= w < len(self.taken) or self.taken[w] is None:
            return MISSING
        item = self.taken[w].get()
        if item is None or item[0] != key:
            self.taken[w] = None       # out of step, or gone: nothing more is taken from it
            return MISSING
        return item[1]

    def close(self) -> None:
        """Stop and reap the workers (they may still be walking when the story has ended)."""
        import os
        import signal

        for pid, _inp in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        for reader in self.readers:     # each ends at its worker's end: none is left to outlive a later fork
            reader.join(5.0)
        self.children, self.readers = [], []


def verify_all(envelopes: list[ev.Envelope], from_seq: int = 1, to_seq: int | None = None, n: int = 0
               ) -> list[tuple[int, Any]]:
    """``rota.core.timetravel.verify`` over the range, the cycles shared out among forked workers;
    (sequence, divergence or None) for every recorded cycle, in log order."""
    return check_all(envelopes, from_seq, to_seq, n, latency=None)[0]


def check_all(envelopes: list[ev.Envelope], from_seq: int = 1, to_seq: int | None = None, n: int = 0,
              latency: int | None = DEFAULT_LATENCY) -> tuple[list[tuple[int, Any]], list[Any]]:
    """Every recorded cycle re-run (as :func:`verify_all`) and, unless ``latency`` is None, every
    moment between them checked for a job left waiting (``rota.core.liveness.late_starts``); the
    evaluations shared out among forked workers, each replaying the log once (the first also noting what the
    waits are then read from, so that nobody replays it again)."""
    from rota.core.liveness import Walked, checked_and_startable, late_from
    from rota.core.timetravel import verify

    def work(w: int, n: int) -> tuple[list, dict, Walked | None]:
        def pick(k: int) -> bool:
            return k % n == w
        if latency is None:
            return list(verify(envelopes, from_seq, to_seq, pick=pick)), {}, None
        walked = Walked() if w == 0 else None
        return (*checked_and_startable(envelopes, from_seq, to_seq, pick, walked=walked), walked)

    n = n or workers()
    parts = forked_map(work, n) if len(envelopes) >= 2000 else None
    if parts is None:
        parts = [work(0, 1)]
    cycles = sorted((r for part in parts for r in part[0]), key=lambda r: r[0])
    walked = parts[0][2]
    if latency is None or walked is None:
        return cycles, []
    known = {k: v for part in parts for k, v in part[1].items()}
    late = [x for x in late_from(walked, known, latency) if x.seq >= from_seq]
    return cycles, late


def job_seqs(job_id: int) -> tuple[int, int, bool] | None:
    """From the projection: the job's submit sequence, the last sequence that changed it and whether
    it has ended (so `why` reads the log only as far as the job's story goes); None if unknown."""
    import os

    from rota.projections.queries import job_seqs as seqs
    from rota.wire.paths import projections_db

    path = projections_db()
    return seqs(path, job_id) if os.path.exists(path) else None


def history_rows(job_id: int) -> tuple[list[tuple], int]:
    """A job's reason intervals from the projection, and the time the projection has reached."""
    import os

    from rota.projections import queries
    from rota.wire.paths import projections_db

    path = projections_db()
    if not os.path.exists(path):
        raise OSError(f"no projection at {path}: is `rota up` running (or ROTA_STATE_DIR set)? "
                      "`rota history N --log FILE` reads a log instead")
    try:
        conn = queries.connect(path)
        rows = [tuple(r) for r in queries.reason_history(conn, job_id)]
        now = conn.execute("SELECT value FROM meta WHERE key = 'now'").fetchone()
    except queries.Error as exc:
        raise OSError(f"cannot read the projection {path}: {exc}") from None
    return rows, int(now[0]) if now else 0


def history_text(job_id: int, rows: list[tuple], now: int) -> list[str]:
    """``rota history``: one line per interval."""
    if not rows:
        return [f"Job {job_id}: no pending reason recorded (it started at its first evaluation, is not known, "
                "or the projection has not reached it yet)."]
    out = [f"Job {job_id}: pending reasons over time", f"  {'REASON':<28} {'FROM':<19}  {'TO':<19}  FOR"]
    for code, start, end, _seq in rows:
        until = _t(end) if end is not None else "(still)"
        out.append(f"  {code:<28} {_t(start):<19}  {until:<19}  {_dur((end if end is not None else now) - start)}")
    out.append(f"`rota why {job_id}` explains each interval: who held what it needed, and when it expected to start.")
    return out


def parse_at(text: str | None) -> tuple[int | None, int | None]:
    """``--at``: a log sequence (a plain number below 10^9), epoch seconds, or YYYY-MM-DD[THH:MM[:SS]]."""
    if text is None:
        return None, None
    t = text.strip()
    if t.isdecimal():
        n = int(t)
        return (n, None) if n < 1_000_000_000 else (None, n)
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return None, int(_dt.datetime.strptime(t, fmt).timestamp())
        except ValueError:
            pass
    raise ValueError(f"--at {text!r}: use a log sequence number, epoch seconds or YYYY-MM-DDTHH:MM[:SS]")


@functools.lru_cache(maxsize=4096)
def _t(ts: int | None) -> str:
    """A moment as local time (a story names the same moments many times)."""
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "unknown"


def _dur(seconds: int) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    parts = [f"{d}d"] if d else []
    parts += [f"{h}h"] if h else []
    parts += [f"{m:02d}m" if (d or h) else f"{m}m"]
    if sec and not d:
        parts.append(f"{sec:02d}s")
    return "".join(parts)


def _story(rep: Any, users: dict[int, str]) -> list[tuple[int, int, list[str]]]:
    """What happened to the job, each as (time, sequence, lines), to be told in log order: its intervals,
    the jobs backfilled past it, administrators' actions, preemptions."""
    story: list[tuple[int, int, list[str]]] = []
    for iv in rep.intervals:
        story.append((iv.start, iv.first_seq, _interval_lines(iv, rep, users)))
    for b in rep.backfilled_past:
        story.append((b["time"], b["seq"], [
            f"  Job {b['job_id']} ({b['user']}) started ahead of it by backfill at {_t(b['time'])}: it had to end "
            f"by {_t(b['ends_by'])}, before this job's reserved start {_t(b['reserved_start'])}, so it did not "
            "delay it."]))
    for a in rep.actions:
        story.append((a["time"], a["seq"], _action_lines(a)))
    for p in rep.preempted:
        story.append((p["time"], p["seq"], _preempted_lines(p)))
    for p in rep.preempting:
        victims = ", ".join(f"job {v['job_id']} ({v.get('user', '?')}, QOS {v.get('qos', '?')})" for v in p["victims"])
        story.append((p["time"], p["seq"], [f"  At {_t(p['time'])} it preempted {victims}, chosen from "
                                            f"{p['candidates']} candidate(s) (sequence {p['seq']})."]))
    return story


_ACTION_WORDS = {"node.drained": "drained", "node.down": "set down", "node.resumed": "resumed",
                 "node.health_fault": "reported a health fault on", "job.held": "held the job",
                 "job.released": "released the job", "job.updated": "updated the job",
                 "cluster.configured": "changed the cluster configuration", "job.cancelled": "cancelled the job",
                 "job.requeued": "requeued the job", "job.gpu_busy": "found its GPUs busy again on"}


def _action_lines(a: dict) -> list[str]:
    """One action in a job's story; idle GPUs with the samples that showed it."""
    if a["action"] == "job.gpu_idle":
        samples = "; ".join(f"{_t(s['t'])} gpu {s['gpu']} {s['util']}% {s['mem']} MiB" for s in a["samples"])
        return [f"  At {_t(a['time'])} the agent on {a['node']} reported its GPUs idle since {_t(a['since'])} "
                f"(sequence {a['seq']}); the samples: {samples or 'none kept'}."]
    target = f" {a['node']}" if "node" in a else ""
    reason = f' ("{a["reason"]}")' if a.get("reason") else ""
    return [f"  At {_t(a['time'])} {a['actor']} {_ACTION_WORDS[a['action']]}{target}{reason} (sequence {a['seq']})."]


def why_text(rep: Any, users: dict[int, str]) -> list[str]:
    if not rep.found:
        return [f"job {rep.job_id} is not in this log (sequences {rep.log_range[0]}-{rep.log_range[1]})"]
    out = []
    head = f'Job {rep.job_id} "{rep.name}" (user {rep.user}, partition {rep.partition})'
    if rep.start_time is not None:
        waited = rep.start_time - rep.submit_time
        out.append(f"{head} waited {_dur(waited)}: submitted {_t(rep.submit_time)}, started {_t(rep.start_time)} "
                   f"on {compress(list(rep.nodes))}" + (" by backfill." if rep.backfilled else "."))
    else:
        end = rep.intervals[-1].end if rep.intervals else rep.submit_time
        state = f" It ended {rep.end_state} without starting." if rep.end_state else " It is still pending."
        out.append(f"{head} was submitted {_t(rep.submit_time)} and had waited {_dur(end - rep.submit_time)}"
                   f" by the last event of the log.{state}")
    if not rep.intervals:
        out.append("  The first cycle after its submission started it, before anything else happened: there "
                   "was no wait to explain." if rep.start_time is not None else
                   "  The log ends where it was submitted: there is nothing to evaluate yet.")
    story = _story(rep, users)
    for _t0, _seq, lines in sorted(story, key=lambda x: (x[0], x[1])):
        out += lines
    if len(rep.estimates) > 1:
        out.append("  How its expected start moved: " + "; ".join(
            f"at {_t(t)}: " + (f"{_t(s)}" + (" (estimate)" if est else " (reserved)") if s else "none")
            for t, s, est in rep.estimates) + ".")
    if rep.start_time is not None:
        out.append(f"  It started at {_t(rep.start_time)} (sequence {rep.start_seq}).")
    if rep.from_snapshot:
        out.append(f"Replayed from the snapshot at sequence {rep.from_snapshot}.")
    out.extend(f"Where Slurm could have decided otherwise: {d}." for d in rep.slurm_differences)
    out.append(f"Derived from log sequences {rep.log_range[0]}-{rep.log_range[1]}, the configuration of sequence "
               f"{rep.config_seq}, rota {', '.join(rep.versions) or '?'} (policy {rep.policy}); reasons are "
               "recomputed at every recorded cycle (from the state just before its decision) and at every change "
               "of the state between them.")
    return out


def _preempted_lines(p: dict) -> list[str]:
    """Who preempted the job, under which rule, and how it was chosen over the other candidates."""
    by = p["by"]
    how = "requeued (it keeps its id and runs again)" if p["mode"] == "requeue" else "ended PREEMPTED"
    grace = f", after SIGTERM and a grace time of {p['grace']}s" if p["grace"] else ""
    out = [f"  At {_t(p['time'])} job {by['job_id']} ({by.get('user', '?')}, QOS {by.get('qos', '?')}) preempted it "
           f"(sequence {p['seq']}): QOS {by.get('qos', '?')} may preempt {', '.join(p['may_preempt']) or '?'}; it was "
           f"{how}{grace}."]
    cands = p["candidates"]
    if cands:
        tried = "; ".join(f"job {c['job_id']} ({c.get('user', '?')}, QOS {c.get('qos', '?')} priority "
                          f"{c.get('qos_priority', 0)}, started {_t(c.get('start'))})"
                          + (" - chosen" if c["job_id"] in p["victims"] else "") for c in cands[:10])
        out.append(f"     Candidates, in the order tried on each node (lowest QOS priority, then youngest; the nodes "
                   f"needing the fewest victims were used): {tried}.")
    return out


def _factors(f: Any) -> str:
    """A priority and its weighted parts, as sprio names them."""
    prio, age, fairshare, size, partition, qos, nice, *rest = f
    accuracy = rest[0] if rest else 0
    parts = [f"{name} {value}" for name, value in (("fair-share", fairshare), ("age", age), ("job size", size),
                                                  ("partition", partition), ("QOS", qos), ("accuracy", accuracy))
             if value]
    parts += [f"nice {nice}"] if nice else []
    return f"{prio} ({', '.join(parts) or 'no weighted factor'})"


def _interval_lines(iv: Any, rep: Any, users: dict[int, str]) -> list[str]:
    sentence = SENTENCES.get(iv.reason, iv.reason)   # a code from an older rota: shown as is
    code = iv.reason if iv.text == iv.reason else f"{iv.reason}: {iv.text}"
    out = [f"  From {_t(iv.start)} for {_dur(iv.end - iv.start)}: {sentence} [{code}]."]
    if not iv.evaluated:
        out.append("     The cycles stopped before reaching it (bf_max_job_test): it was ranked, not evaluated.")
    if iv.rank:
        ahead = ", ".join(f"job {j} ({users.get(j, '?')})" for j in iv.ahead[:8])
        more = f" and {len(iv.ahead) - 8} more" if len(iv.ahead) > 8 else ""
        out.append(f"     It was number {iv.rank} in priority order (priority {iv.priority})"
                   + (f"; ahead of it, competing for the same nodes: {ahead}{more}." if ahead else "."))
        if iv.ahead_factors and iv.factors:
            other, theirs = iv.ahead_factors
            out.append(f"     Ranked behind job {other} ({users.get(other, '?')}) by its priority factors: "
                       f"{_factors(theirs)}, against this job's {_factors(iv.factors)}.")
    def held(jobs: list[int], ended: str = "ended") -> str:
        ends = [f"job {j} ({users.get(j, '?')})" + (f", which {ended} {_t(rep.blocker_ends[j])}"
                                                     if j in rep.blocker_ends else "") for j in jobs[:8]]
        return "; ".join(ends) + (f" and {len(jobs) - 8} more" if len(jobs) > 8 else "")

    decisive = [j for j in iv.decisive if j in iv.blockers]
    others = [j for j in iv.blockers if j not in decisive]
    if decisive and iv.expected_start:
        due = held(decisive, "in fact ended")
        out.append(f"     It waited for {due}: the expected start {_t(iv.expected_start)} is when "
                   f"{'that job reaches its' if len(decisive) == 1 else 'those jobs reach their'} time limit.")
        if others:
            out.append(f"     Also on those nodes, ending sooner but not freeing enough on their own: {held(others)}.")
    elif iv.blockers:
        out.append(f"     What it needs was held by {held(iv.blockers)}.")
    if iv.detail:
        out.append(f"     In numbers: {iv.detail}.")
    if iv.expected_start and iv.estimated:
        out.append(f"     Estimated start then: {_t(iv.expected_start)} (an estimate, not a reservation: the plan with "
                   "every waiting job placed in priority order where it fits, each running job using its whole limit).")
    elif iv.expected_start:
        out.append(f"     Expected start then: {_t(iv.expected_start)} (a reservation was held for it).")
    seen = [f"{iv.cycles} recorded cycle{'s' if iv.cycles != 1 else ''}"] if iv.cycles else []
    if iv.derived:
        seen.append(f"{iv.derived} change{'s' if iv.derived != 1 else ''} of the state between cycles")
    out.append(f"     Evaluated at {' and '.join(seen)} (log sequences {iv.first_seq}-{iv.last_seq}); it held until "
               f"{_t(iv.end)}.")
    return out


def why_json(rep: Any) -> str:
    """The whole explanation as indented JSON (orjson: the report's dataclasses as they are, tuples as lists)."""
    import orjson

    return orjson.dumps(rep, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def replay_views(envelopes: Iterable[ev.Envelope], at_seq: int | None, at_time: int | None,
                 state: Any = None) -> list[str]:
    from rota.core.schedule import schedule
    from rota.core.timetravel import replay_to

    st = replay_to(envelopes, at_seq, at_time, state)
    now = at_time if at_time is not None else st.now
    d = schedule(st, now, explain=False) if st.pending else None
    out = [f"as of {_t(now)} (log sequence {st.seq})", "",
           f"{'JOBID':>8} {'PARTITION':>9} {'NAME':>10} {'USER':>8} {'ST':>2} {'TIME':>10} {'NODES':>6} NODELIST(REASON)"]
    for jid in list(st.running) + list(st.pending):
        job = st.jobs[jid]
        running = job.state == "RUNNING"
        p = d.pending_of(jid) if d is not None and not running else None
        reason = ",".join(a.node for a in job.alloc) if running else f"({p.display if p is not None else 'None'})"
        t = format_duration(now - job.start_time) if running else "0:00"
        out.append(f"{jid:>8} {job.partition:>9.9} {job.spec.name:>10.10} {job.spec.user:>8.8} "
                   f"{'R' if running else 'PD':>2} {t:>10} {len(job.alloc) or 1:>6} {reason}")
    out += ["", f"{'NODE':<10} {'STATE':<10} {'CPUS(A/T)':>10} {'GPUS(A/T)':>10} REASON"]
    for n in st.nodes.values():
        out.append(f"{n.name:<10} {n.display_state().lower():<10} {f'{n.alloc_cpus}/{n.cpus}':>10} "
                   f"{f'{n.gpu_count - n.free_gpus}/{n.gpu_count}':>10} {n.reason or ''}")
    return out


def whatif_text(res: Any, set_: list[str], top: int) -> list[str]:
    """``rota whatif``: how close the baseline is, the figures side by side, who gains and who loses."""
    inputs = ", ".join(f"{n} {kind}" for kind, n in res.inputs.items())
    out = [f"replayed the log's inputs ({inputs}), re-deciding every start, with a cycle at each recorded cycle "
           f"and {res.latency} s after every change (the cycle latency measured on the log)",
           f"under the recorded settings {res.baseline_matches_history} of the {res.replayed} jobs that ran start "
           f"exactly when they did (mean difference {res.baseline_error:.1f} s)"]
    out.append(f"{'figure':<22} {'recorded settings':>18} {'with ' + ' '.join(set_):>24}")
    for k in ("jobs", "avg_wait", "avg_bsld", "util", "gpu_util", "makespan", "backfilled"):
        if k in res.baseline or k in res.changed:
            out.append(f"{k:<22} {res.baseline.get(k, 0):>18,.2f} {res.changed.get(k, 0):>24,.2f}")
    ranked = sorted(res.per_job, key=lambda j: j["change"])
    gains = [j for j in ranked if j["change"] < 0][:top]
    losses = [j for j in reversed(ranked) if j["change"] > 0][:top]
    for title, rows in (("waits less", gains), ("waits more", losses)):
        if rows:
            out.append(f"{title}: " + ", ".join(f"job {j['job']} ({j['user']}) {j['change']:+,d} s" for j in rows))
    if res.by_user:
        out.append("by user (mean change of wait): " + ", ".join(f"{u} {c:+,.0f} s" for u, c in res.by_user.items()))
    return out
