"""The SQLite tables the projector maintains (squeue/sinfo/sacct views of the log)."""

SCHEMA_VERSION = 6

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value
);
CREATE TABLE IF NOT EXISTS jobs (
    job_id INTEGER PRIMARY KEY,     -- the unique id (an array task's own id)
    array_job_id INTEGER,
    array_task_id INTEGER,
    array_spec TEXT,                -- pending indices of an array's remainder record, e.g. "4-9%2"
    name TEXT, user TEXT, uid INTEGER, account TEXT, partition TEXT, qos TEXT,
    state TEXT NOT NULL,
    cancel_by INTEGER,
    submit INTEGER, eligible INTEGER, start INTEGER, end_time INTEGER,
    time_limit INTEGER,
    exit_code INTEGER, signal INTEGER, max_rss INTEGER, elapsed INTEGER,
    nodes TEXT,                      -- comma-separated allocation, in order
    alloc_nodes INTEGER, alloc_cpus INTEGER, alloc_mem INTEGER, alloc_gpus INTEGER,
    req_nodes INTEGER, req_cpus INTEGER, req_mem INTEGER, req_gpus INTEGER, gpu_type TEXT,
    restarts INTEGER, workdir TEXT, dependency TEXT, hold TEXT, priority INTEGER,
    submit_seq INTEGER,
    reason TEXT,                     -- why a job that never started ended pending (e.g. DependencyNeverSatisfied)
    seq INTEGER                      -- log sequence of the last event that changed the row
);
CREATE INDEX IF NOT EXISTS jobs_user ON jobs(user);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_array ON jobs(array_job_id);
CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_time);
CREATE TABLE IF NOT EXISTS steps (   -- ``batch`` and each srun step (``0``, ``1``, ...) of a job's last run
    job_id INTEGER, step TEXT, name TEXT, state TEXT, exit_code INTEGER, signal INTEGER,
    max_rss INTEGER, elapsed INTEGER, start INTEGER, end_time INTEGER,
    ntasks INTEGER, cpus INTEGER, nodes TEXT,
    PRIMARY KEY (job_id, step)
);
CREATE TABLE IF NOT EXISTS runs (    -- earlier runs of requeued jobs (sacct -D: REQUEUED or PREEMPTED)
    job_id INTEGER, restarts INTEGER, start INTEGER, end_time INTEGER, nodes TEXT, alloc_cpus INTEGER,
    exit_code INTEGER, signal INTEGER, alloc_gpus INTEGER, state TEXT,
    PRIMARY KEY (job_id, restarts)
);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY, idx INTEGER, state TEXT, reason TEXT, reason_by TEXT, reason_time INTEGER,
    cpus INTEGER, alloc_cpus INTEGER, memory INTEGER, alloc_mem INTEGER,
    gpus INTEGER, alloc_gpus INTEGER, gres TEXT, features TEXT, partitions TEXT, boot_time INTEGER,
    jobs TEXT, base TEXT, drain INTEGER, not_responding INTEGER, weight INTEGER, last_busy INTEGER
);
CREATE TABLE IF NOT EXISTS partitions (
    name TEXT PRIMARY KEY, idx INTEGER, is_default INTEGER, state TEXT, max_time INTEGER,
    default_time INTEGER, nodes TEXT, priority_tier INTEGER, max_nodes INTEGER
);
CREATE TABLE IF NOT EXISTS reasons (   -- each job's pending reasons over time, as `rota why` derives them
    job_id INTEGER, code TEXT, start INTEGER,
    end_time INTEGER,                -- NULL while it lasts
    seq INTEGER,                     -- the log sequence it was derived after
    PRIMARY KEY (job_id, start, seq)
);
CREATE TABLE IF NOT EXISTS node_states (   -- each node's state over time: a row whenever it or its reason changed
    node TEXT, time INTEGER, seq INTEGER, state TEXT, reason TEXT, gpus INTEGER
);
CREATE INDEX IF NOT EXISTS node_states_time ON node_states(time);
CREATE TABLE IF NOT EXISTS usage (
    user TEXT, account TEXT, partition TEXT,
    cpu_seconds INTEGER, gpu_seconds INTEGER, jobs INTEGER,
    PRIMARY KEY (user, account, partition)
);
"""
