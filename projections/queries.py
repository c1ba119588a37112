"""The projection's read API: what sacct, sinfo, scontrol and time travel ask of it, in one place.

Light (the commands import it): the C module under ``sqlite3``, read-only connections, rows by name.
"""
from __future__ import annotations

import sys
from contextvars import ContextVar

try:   # the C module under ``sqlite3``: sqlite3.dbapi2 also imports datetime for adapters never used here
    import _sqlite3 as sqlite3
except ImportError:  # pragma: no cover
    import sqlite3  # type: ignore[no-redef]

Error = sqlite3.Error
Row = sqlite3.Row


FRESH_WAIT = 10.0      # seconds a read waits for the projection to fold what this host was last shown
_at_least: ContextVar[int | None] = ContextVar("rota_projection_at_least", default=None)


def connect(path: str):  # -> sqlite3.Connection
    """A read-only connection to the projection at ``path`` whose rows read by column name, once the
    projection has folded every event an answer on this host has shown (read-your-writes; bounded)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    target = at_least()
    if target is None:
        from rota.wire.seen import newest

        target = newest()
    from .hurry import path_for

    behind = wait_until_folded(conn, target, hurry_line=path_for(path))
    if behind:
        sys.stderr.write(f"warning: the cluster's state at {path} is {behind:,} events behind the newest change "
                         f"shown on this host after {FRESH_WAIT:.0f} s; what follows may be out of date\n")
    return conn


def at_least() -> int | None:
    """The sequence the reads of this thread of work must see, when set by :func:`reading_at`."""
    return _at_least.get()


def reading_at(seq: int) -> None:
    """Make this context's reads wait for ``seq`` (the controller answering for a caller on another host:
    the state its answer is at, any host's writes included)."""
    _at_least.set(seq)


def folded(conn) -> int:
    """The last log sequence the projection has folded (0 before its first batch)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row is not None and row[0] is not None else 0


def log_time(conn) -> int:
    """The log time of the last event the projection has folded (0 before its first batch)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'now'").fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def cluster_name(conn) -> str:
    """The cluster's name (slurm.conf's ClusterName), as ``-M/--clusters`` names it."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'cluster'").fetchone()
    except sqlite3.Error:
        row = None
    return str(row[0]) if row is not None and row[0] else "rota"


def wait_until_folded(conn, seq: int, timeout: float = FRESH_WAIT, hurry_line: str | None = None) -> int:
    """Wait until the projection has folded ``seq``, asking its projector (at ``hurry_line``) to fold now; how many
    events it is still behind (0: caught up)."""
    have = folded(conn)
    if have >= seq:
        return 0
    import time

    from . import hurry

    deadline = time.monotonic() + timeout
    answer = hurry.ask(hurry_line, seq) if hurry_line is not None else None
    pause = 0.001
    try:
        while have < seq:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if answer is not None:
                hurry.await_answer(answer, min(hurry.LOOK_AGAIN, left))
            else:
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.02)
            have = folded(conn)
    finally:
        if answer is not None:
            answer.close()
    return max(0, seq - have)


class JobQuery:
    """Which job rows sacct wants (every field optional; empty means no filter). A plain class: the
    commands import this module, and ``dataclasses`` costs them more than everything else here."""

    __slots__ = ("ids", "users", "uid", "only_uid", "states", "names", "partitions", "start", "end")

    def __init__(self, *, uid: int | None = None, only_uid: int | None = None, start: int | None = None,
                 end: int | None = None) -> None:
        self.ids: list[tuple[int, int | None]] = []    # (job or array id, array task or None)
        self.users: list[str] = []                     # names or uids
        self.uid = uid                  # only this uid's jobs (sacct's default for a user)
        self.only_uid = only_uid        # never anyone else's (PrivateData=jobs)
        self.states: list[str] = []
        self.names: list[str] = []
        self.partitions: list[str] = []
        self.start = start              # active at or after
        self.end = end                  # submitted at or before


def jobs(conn, q: JobQuery) -> list:
    """The job rows ``q`` selects, arrays with their tasks in order."""
    where: list[str] = []
    args: list[object] = []

    def among(column: str, values: list) -> None:
        where.append(f"{column} IN ({','.join('?' * len(values))})")
        args.extend(values)

    if q.ids:
        clauses = []
        for base, task in q.ids:
            if task is not None:
                clauses.append("(array_job_id = ? AND array_task_id = ?)")
                args.extend((base, task))
            else:
                clauses.append("(job_id = ? OR array_job_id = ?)")
                args.extend((base, base))
        where.append("(" + " OR ".join(clauses) + ")")
    if q.users:
        marks = ",".join("?" * len(q.users))
        where.append(f"(user IN ({marks}) OR CAST(uid AS TEXT) IN ({marks}))")
        args.extend(q.users + q.users)
    for uid in (q.uid, q.only_uid):
        if uid is not None:
            where.append("uid = ?")
            args.append(uid)
    for column, values in (("state", q.states), ("name", q.names), ("partition", q.partitions)):
        if values:
            among(column, values)
    if q.start is not None:
        where.append("(end_time = 0 OR end_time >= ?)")
        args.append(q.start)
    if q.end is not None:
        where.append("submit <= ?")
        args.append(q.end)
    sql = ("SELECT jobs.*, (SELECT code FROM reasons WHERE reasons.job_id = jobs.job_id ORDER BY start DESC, "
           "seq DESC LIMIT 1) AS last_reason FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY COALESCE(array_job_id, job_id), COALESCE(array_task_id, -1), job_id")
    return conn.execute(sql, args).fetchall()


def reason_history(conn, job_id: int) -> list:
    """A job's pending-reason intervals, oldest first (``end_time`` NULL: it still holds)."""
    return conn.execute("SELECT code, start, end_time, seq FROM reasons WHERE job_id = ? ORDER BY start, seq",
                        (job_id,)).fetchall()


def steps(conn, job_ids: list[int]) -> dict:
    """The step rows of each of these jobs that has any: ``batch`` first, then srun's steps in order."""
    if not job_ids:
        return {}
    listed = ",".join(str(int(j)) for j in job_ids)   # integers, inline: no limit on how many
    out: dict = {}
    for s in conn.execute(f"SELECT * FROM steps WHERE job_id IN ({listed}) "
                          "ORDER BY job_id, step != 'batch', CAST(step AS INTEGER)"):
        out.setdefault(s["job_id"], []).append(s)
    return out


def runs(conn, job_ids: list[int]) -> dict:
    """The earlier runs of each of these jobs that was requeued, oldest first."""
    if not job_ids:
        return {}
    listed = ",".join(str(int(j)) for j in job_ids)
    out: dict = {}
    for r in conn.execute(f"SELECT * FROM runs WHERE job_id IN ({listed}) ORDER BY job_id, restarts"):
        out.setdefault(r["job_id"], []).append(r)
    return out


def nodes(conn) -> list:
    """The nodes, each with ``planned``: kept by the scheduler's latest plan for a pending job (the reason lane's)."""
    return conn.execute("SELECT n.*, n.name IN (SELECT value FROM json_each((SELECT value FROM meta WHERE "
                        "key = 'planned'))) AS planned FROM nodes n ORDER BY idx").fetchall()


def partitions(conn) -> list:
    return conn.execute("SELECT * FROM partitions ORDER BY idx").fetchall()


def job_seqs(path: str, job_id: int) -> tuple[int, int, bool] | None:
    """A job's submit sequence, the last sequence that changed it and whether it has ended (how far
    time travel must read the log for it); None when the projection does not know it."""
    try:
        row = connect(path).execute("SELECT submit_seq, seq, end_time FROM jobs WHERE job_id = ?",
                                    (job_id,)).fetchone()
    except Error:
        return None
    if not row or not row[0]:
        return None
    return row[0], row[1], bool(row[2])


def usage(conn, start: int, end: int, now: int, only_uid: int | None = None) -> list:
    """CPU- and GPU-seconds each (account, user) used within [start, end): every run's allocation times the
    part of it inside the period (a running job's up to ``now``), the runs of requeued jobs included."""
    mine = "" if only_uid is None else " AND j.uid = :uid"
    return conn.execute(f"""
        SELECT account, user, SUM(cpus * secs) AS cpu_seconds, SUM(gpus * secs) AS gpu_seconds,
               COUNT(DISTINCT job_id) AS jobs
        FROM (SELECT j.job_id, j.account, j.user, COALESCE(j.alloc_cpus, 0) AS cpus,
                     COALESCE(j.alloc_gpus, 0) AS gpus,
                     MIN(COALESCE(NULLIF(j.end_time, 0), :now), :end) - MAX(j.start, :start) AS secs
              FROM jobs j WHERE j.start > 0{mine}
              UNION ALL
              SELECT r.job_id, j.account, j.user, COALESCE(r.alloc_cpus, 0), COALESCE(r.alloc_gpus, 0),
                     MIN(r.end_time, :end) - MAX(r.start, :start)
              FROM runs r JOIN jobs j ON j.job_id = r.job_id WHERE r.start > 0{mine})
        WHERE secs > 0
        GROUP BY account, user ORDER BY account, user""",
                        {"start": start, "end": end, "now": now, "uid": only_uid}).fetchall()


def job_record(conn, job_id: int):
    """One job's row (None: the projection does not know it)."""
    return conn.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()


def activity(conn) -> list:
    """Every run as (start, end or 0 while it runs, GPUs), requeued runs included: what the cluster did over time."""
    return conn.execute("SELECT start, end_time, COALESCE(alloc_gpus, 0) FROM jobs WHERE start > 0 UNION ALL "
                        "SELECT start, end_time, COALESCE(alloc_gpus, 0) FROM runs WHERE start > 0").fetchall()


def reason_spans(conn) -> list:
    """Every job's pending-reason intervals as (code, start, end or NULL while it lasts)."""
    return conn.execute("SELECT code, start, end_time FROM reasons").fetchall()


def node_history(conn) -> list:
    """Each node's states over time as (node, time, state, reason, GPUs), oldest first."""
    return conn.execute("SELECT node, time, state, reason, gpus FROM node_states ORDER BY time, seq").fetchall()


def queue_at(conn, t: int, only_uid: int | None = None) -> list:
    """The jobs waiting or running at log time ``t``, each with the pending reason it had then (NULL: none kept)."""
    mine = "" if only_uid is None else " AND j.uid = :uid"
    return conn.execute(f"""
        SELECT j.job_id, j.name, j.user, j.uid, j.partition, j.submit, j.start, j.end_time, j.alloc_gpus, j.nodes,
               CASE WHEN j.start > 0 AND j.start <= :t THEN 'RUNNING' ELSE 'PENDING' END AS state,
               (SELECT code FROM reasons r WHERE r.job_id = j.job_id AND r.start <= :t
                AND (r.end_time IS NULL OR r.end_time > :t) ORDER BY r.start DESC, r.seq DESC LIMIT 1) AS reason
        FROM jobs j WHERE j.submit <= :t AND (j.end_time = 0 OR j.end_time > :t){mine}
        ORDER BY state DESC, j.job_id""", {"t": t, "uid": only_uid}).fetchall()


def scrape_figures(conn) -> dict:
    """What the projection adds to ``/metrics``: how far it has folded (sequence, log time) and the GPU-seconds
    each user used under each account."""
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('seq', 'now')").fetchall())
    rows = conn.execute("SELECT user, account, SUM(gpu_seconds) FROM usage GROUP BY user, account "
                        "ORDER BY user, account").fetchall()
    return {"seq": int(meta.get("seq") or 0), "now": int(meta.get("now") or 0),
            "gpu_seconds": [(r[0], r[1], int(r[2] or 0)) for r in rows]}
