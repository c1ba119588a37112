"""``srun``: run a step, inside the job it is called from, or in an allocation it asks for first.

Inside a job (``SLURM_JOB_ID``, or ``--jobid``) the controller lays the step out over the job's nodes and
logs it; each node's agent starts its tasks and connects back here, as Slurm's step daemons connect to
``srun``: stdin goes to every task, what the tasks write comes back (``--label`` prefixes each line
with the task's rank), and ``srun`` exits with the worst task's status. Outside a job it first gets an
allocation (waiting, and saying why), runs the step, and gives the allocation back.
"""
from __future__ import annotations

import _signal as signal      # the C modules under signal, socket and threading: no enum, no selectors
import _socket as socket
import _thread
import os
import sys
import time

from . import lightjson
from .options import NO, OPTIONAL, REQUIRED, OptionError, node_count, parse, table

from rota.wire import stepio

TYPE_CHECKING = False     # (typing's, without importing typing: srun starts light)
if TYPE_CHECKING:
    from .stepfiles import Files

OPTIONS = table(
    ("A", "account", REQUIRED, "account"), ("", "acctg-freq", REQUIRED, "~acctg-freq"),
    ("b", "begin", REQUIRED, "begin"), ("D", "chdir", REQUIRED, "chdir"), ("C", "constraint", REQUIRED, "constraint"),
    ("", "cpu-bind", REQUIRED, "~cpu-bind"), ("c", "cpus-per-task", REQUIRED, "cpus_per_task"),
    ("d", "dependency", REQUIRED, "dependency"), ("m", "distribution", REQUIRED, "~distribution"),
    ("e", "error", REQUIRED, "error"), ("x", "exclude", REQUIRED, "exclude"), ("", "exact", NO, "~exact"),
    ("", "exclusive", NO, "~exclusive"), ("", "export", REQUIRED, "export"), ("", "gpu-bind", REQUIRED, "~gpu-bind"),
    ("G", "gpus", REQUIRED, "gpus"), ("", "gpus-per-node", REQUIRED, "gpus_per_node"),
    ("", "gpus-per-task", REQUIRED, "gpus_per_task"), ("", "gres", REQUIRED, "gres"), ("h", "help", NO, "help"),
    ("H", "hold", NO, "hold"),
    ("", "hint", REQUIRED, "~hint"), ("I", "immediate", OPTIONAL, "immediate"), ("i", "input", REQUIRED, "input"),
    ("J", "job-name", REQUIRED, "job_name"),
    ("", "jobid", REQUIRED, "jobid"), ("K", "kill-on-bad-exit", OPTIONAL, "kill_on_bad_exit"),
    ("l", "label", NO, "label"), ("", "mem", REQUIRED, "mem"), ("", "mem-bind", REQUIRED, "~mem-bind"),
    ("", "mem-per-cpu", REQUIRED, "mem_per_cpu"), ("", "mem-per-gpu", REQUIRED, "mem_per_gpu"),
    ("", "mincpus", REQUIRED, "mincpus"), ("", "mpi", REQUIRED, "~mpi"), ("", "multi-prog", NO, "multi_prog"),
    ("w", "nodelist", REQUIRED, "nodelist"),
    ("N", "nodes", REQUIRED, "nodes"), ("n", "ntasks", REQUIRED, "ntasks"),
    ("", "ntasks-per-node", REQUIRED, "ntasks_per_node"), ("o", "output", REQUIRED, "output"),
    ("", "overlap", NO, "overlap"), ("O", "overcommit", NO, "overcommit"), ("p", "partition", REQUIRED, "partition"),
    ("", "propagate", REQUIRED, "~propagate"), ("", "pty", NO, "!pty"), ("q", "qos", REQUIRED, "qos"),
    ("Q", "quiet", NO, "quiet"), ("", "quit-on-interrupt", NO, "quit_on_interrupt"),
    ("t", "time", REQUIRED, "time"), ("", "task-prolog", REQUIRED, "task_prolog"), ("T", "threads", REQUIRED, "~threads"),
    ("", "task-epilog", REQUIRED, "task_epilog"), ("u", "unbuffered", NO, "unbuffered"), ("v", "verbose", NO, "verbose", True),
    ("", "usage", NO, "usage"), ("V", "version", NO, "version"), ("W", "wait", REQUIRED, "wait"),
    ("X", "disable-status", NO, "~disable-status"),
)
# Environment variables srun reads as options (a command-line option wins), as Slurm 22.05's srun does.
# Inside a job, only those that shape how the step runs: the job's own environment sets the others.
ENV_ALWAYS = {"SRUN_CPUS_PER_TASK": "cpus_per_task", "SLURM_DEBUG": "verbose", "SLURM_STDOUTMODE": "output",
              "SLURM_STDERRMODE": "error", "SLURM_STDINMODE": "input", "SLURM_LABELIO": "label",
              "SLURM_UNBUFFEREDIO": "unbuffered", "SLURM_KILL_BAD_EXIT": "kill_on_bad_exit", "SLURM_WAIT": "wait",
              "SLURM_OVERCOMMIT": "overcommit", "SLURM_OVERLAP": "overlap", "SLURM_TASK_PROLOG": "task_prolog",
              "SLURM_TASK_EPILOG": "task_epilog"}
ENV_OUTSIDE_A_JOB = {"SLURM_ACCOUNT": "account", "SLURM_CONSTRAINT": "constraint", "SLURM_DEPENDENCY": "dependency",
                     "SLURM_GPUS": "gpus", "SLURM_GPUS_PER_NODE": "gpus_per_node", "SLURM_GPUS_PER_TASK": "gpus_per_task",
                     "SLURM_GRES": "gres", "SLURM_JOB_NAME": "job_name", "SLURM_JOB_NUM_NODES": "nodes",
                     "SLURM_MEM_PER_CPU": "mem_per_cpu", "SLURM_MEM_PER_NODE": "mem", "SLURM_NPROCS": "ntasks",
                     "SLURM_NTASKS": "ntasks", "SLURM_NTASKS_PER_NODE": "ntasks_per_node", "SLURM_PARTITION": "partition",
                     "SLURM_QOS": "qos", "SLURM_TIMELIMIT": "time", "SLURM_REMOTE_CWD": "chdir",
                     "SLURM_WORKING_DIR": "chdir"}
FLAGS_FROM_ENV = frozenset({"label", "unbuffered", "overcommit", "overlap"})


def options_from_environment(environ: dict[str, str], in_a_job: bool) -> dict:
    """The options the environment gives (``SLURM_NTASKS=4`` is ``-n 4``); the command line overrides them."""
    out: dict = {}
    for table_ in (ENV_ALWAYS,) if in_a_job else (ENV_OUTSIDE_A_JOB, ENV_ALWAYS):
        for var, dest in table_.items():
            value = environ.get(var)
            if not value:
                continue
            if dest == "verbose":
                out[dest] = [True] * int(value) if value.isdecimal() and int(value) > 0 else None
            elif dest in FLAGS_FROM_ENV:
                out[dest] = True if value.lower() not in ("0", "no") else None
            else:
                out[dest] = value
    return {k: v for k, v in out.items() if v is not None}


BUSY_RETRY = 1.0
CONNECT_TIMEOUT = 60.0
HELLO_WAIT = 5.0          # seconds a connection has to prove it is one of the step's nodes
MAX_UNPROVEN = 256        # connections waiting to prove it at once (the oldest gives way)
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)


class SrunError(Exception):
    """What stops srun (its message is the error line)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _count(values: dict, key: str, option: str) -> int | None:
    text = values.get(key)
    if text is None:
        return None
    if key == "nodes":
        try:
            return node_count("srun", str(text))
        except OptionError as exc:
            raise SrunError(str(exc)) from None
    text = str(text)
    if not text.isdecimal() or int(text) < 1:
        raise SrunError(f"srun: error: Invalid numeric value \"{values[key]}\" for {option}.")
    return int(text)


def step_body(values: dict, argv: list[str], job_id: int) -> dict:
    """The ``step_create`` request for these options."""
    from .environment import ExportError, exported

    try:
        env = exported(values.get("export") or os.environ.get("SRUN_EXPORT_ENV"), dict(os.environ))
    except ExportError as exc:
        raise SrunError(f"srun: error: {exc}") from None
    umask = os.umask(0o022)
    os.umask(umask)
    env["SLURM_UMASK"] = f"{umask:04o}"     # the tasks run with the caller's umask, as in Slurm
    body: dict = {"job_id": job_id, "argv": argv, "workdir": values.get("chdir") or os.getcwd(),
                  "env": {k: v for k, v in env.items() if "\0" not in v}, "label": bool(values.get("label"))}
    for key, option in (("ntasks", "--ntasks"), ("nodes", "--nodes"), ("ntasks_per_node", "--ntasks-per-node"),
                        ("cpus_per_task", "--cpus-per-task"), ("gpus_per_task", "--gpus-per-task")):
        n = _count(values, key, option)
        if n is not None:
            body[key] = n
    body.update(_resources(values))
    for key in ("output", "error", "input"):
        if values.get(key) == "none":      # Slurm's name for nowhere
            values = {**values, key: "/dev/null"}
        if values.get(key):
            body[key] = values[key]
    if values.get("job_name"):
        body["name"] = values["job_name"]
    if values.get("overlap"):
        body["overlap"] = True
    if values.get("overcommit"):
        body["overcommit"] = True
    return body


def _resources(values: dict) -> dict:
    """--gres (GPUs per node), --mem and --nodelist, as the step request carries them."""
    body: dict = {}
    gres = values.get("gres") or values.get("gpus_per_node")
    if gres:
        count = str(gres).rsplit(":", 1)[-1]
        if not count.isdecimal():
            raise SrunError("srun: error: Invalid generic resource (gres) specification")
        body["gpus_per_node"] = int(count)
    if values.get("mem") is not None:
        from .sbatch import SbatchError, parse_mem

        try:
            body["mem"] = parse_mem(values["mem"])
        except SbatchError:
            raise SrunError("srun: error: Invalid --mem specification") from None
    if values.get("nodelist"):
        from rota.core.hostlist import HostlistError, expand

        try:
            body["nodelist"] = expand(values["nodelist"])
        except HostlistError as exc:
            raise SrunError(f"srun: error: Invalid --nodelist specification: {exc}") from None
    return body


def main(argv: list[str], out=None, err=None) -> int:
    out = out or sys.stdout.buffer
    err = err or sys.stderr
    parsed = _parsed(argv, err)
    if isinstance(parsed, int):
        return parsed
    values, command = parsed
    if values.get("verbose"):
        from .options import defined_options

        err.write("".join(line + "\n" for line in defined_options("srun", values, OPTIONS)))
    return _run(values, command, out, err)


def _parsed(argv: list[str], err) -> tuple[dict, list[str]] | int:
    """The options and command srun was given (the environment's options beneath them), or its exit code when
    it has nothing to run: a bad option, --help/--usage, no command."""
    try:
        values, command = parse("srun", argv, OPTIONS, stop_at_operand=True)
        from .options import unsupported

        for warning in unsupported("srun", values):
            err.write(warning + "\n")
    except OptionError as exc:
        err.write(f"{exc}\nTry \"srun --help\" for more information\n")
        return 1
    from .helptext import answered

    if answered("srun", values, OPTIONS, sys.stdout, tail="executable [args...]"):
        return 0
    values = {**options_from_environment(dict(os.environ), bool(values.get("jobid") or os.environ.get("SLURM_JOB_ID")
                                                               or os.environ.get("SLURM_JOBID"))), **values}
    if not command:
        err.write("srun: fatal: No command given to execute.\n")
        return 1
    return values, command


def _run(values: dict, command: list[str], out, err) -> int:
    """Run the step, in the job given or in an allocation made for it and given back after."""
    from .client import AllocationError, NoCluster

    given = values.get("jobid") or os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    made: int | None = None
    step: Step | None = None
    code = 1
    try:
        if given:
            if not str(given).isdecimal():
                raise SrunError(f"srun: error: Invalid job id: {given}")
            job_id = int(given)
        else:
            from .allocation import allocate

            view = allocate("srun", _job_options(values), os.path.basename(command[0]), err, values.get("immediate"))
            job_id = made = int(view["job_id"])
        argv, extra_env = _program(values, command)
        from .stepfiles import STREAMS, Files, srun_side

        files = Files({k: values[k] for k in STREAMS if srun_side(values.get(k))},
                      values.get("job_name") or (os.environ.get("SLURM_JOB_NAME", "") if given
                                                  else os.path.basename(command[0])))
        body = step_body({k: v for k, v in values.items() if k not in files.given}, argv, job_id)
        body["env"].update(extra_env)
        step = Step(job_id, body, out, err, values, files)
        code = step.run()
    except (SrunError, AllocationError) as exc:
        text = str(exc)
        err.write(text if text.startswith("srun:") else f"srun: error: {text}")
        err.write("\n")
        code = exc.code if isinstance(exc, SrunError) else 1
    except NoCluster as exc:
        err.write(f"srun: error: {exc}\n")
        code = 1
    except KeyboardInterrupt:
        code = 130
    finally:
        if made is not None:    # the allocation srun asked for goes back, whatever happened
            from .allocation import release

            release(made, code if code < 128 else 0, code - 128 if code > 128 else 0,
                    step.step_id if step is not None and step.step_id >= 0 else None)
    return code


def _program(values: dict, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """What the step runs and what it adds to the environment: the command, or with ``--multi-prog`` each
    task's line of the file it names; with ``--task-prolog``/``--task-epilog`` around it."""
    import shlex

    from .multiprog import MultiProgError, as_step, script, with_task_scripts

    prolog, epilog = values.get("task_prolog"), values.get("task_epilog")
    if not values.get("multi_prog") and not prolog and not epilog:
        return command, {}
    body = f"exec {shlex.join(command)}"
    if values.get("multi_prog"):
        given = str(values.get("ntasks") or "")
        try:
            body = script(command[0], int(given) if given.isdecimal() else None)
        except MultiProgError as exc:
            raise SrunError(f"srun: error: {exc}") from None
    return as_step(with_task_scripts(body, prolog, epilog) if prolog or epilog else body, command[0])


def _job_information(job_id: int, reply: dict, cpus_per_task: int) -> str:
    """``-v``'s line on where the step runs: ``jobid 7: nodes(2):`n[1-2]', cpu counts: 2(x2)``."""
    from rota.core.hostlist import compress

    counts = reply.get("cpus") or [len(tasks) * cpus_per_task for tasks in reply["tasks"]]
    runs: list[list[int]] = []
    for c in counts:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    text = ",".join(f"{c}(x{n})" if n > 1 else str(c) for c, n in runs)
    return f"srun: jobid {job_id}: nodes({len(counts)}):`{compress(reply['nodes'])}', cpu counts: {text}\n"


def _launching(step: str, reply: dict) -> str:
    """``-v``'s line per node: ``launching StepId=7.0 on host n1, 4 tasks: [0-3]``."""
    from rota.core.hostlist import compress

    return "".join(f"srun: launching StepId={step} on host {node}, {len(tasks)} tasks: "
                   f"{compress([str(t) for t in tasks])}\n" for node, tasks in zip(reply["nodes"], reply["tasks"]))


def _job_options(values: dict) -> dict:
    """The options that shape the allocation ``srun`` asks for (sbatch's names)."""
    job = {k: v for k, v in values.items() if k not in ("label", "unbuffered", "input", "output", "error", "overlap",
                                                        "quiet", "quit_on_interrupt", "gpus_per_task", "jobid", "verbose",
                                                        "immediate", "multi_prog", "kill_on_bad_exit", "wait",
                                                        "task_prolog", "task_epilog")}
    if values.get("gpus_per_task") and not (values.get("gres") or values.get("gpus_per_node")):
        n = _count(values, "gpus_per_task", "--gpus-per-task") or 1
        tasks = _count(values, "ntasks_per_node", "--ntasks-per-node") or _count(values, "ntasks", "--ntasks") or 1
        job["gpus_per_node"] = str(n * tasks)
    return job


class Step:
    """One step's life on the srun side: create it, meet its nodes, relay its I/O, collect its ends."""

    def __init__(self, job_id: int, body: dict, out, err, values: dict, files: "Files | None" = None) -> None:
        self.job_id, self.body, self.out, self.err, self.values = job_id, body, out, err, values
        self.files = files            # -o/-e/-i files srun keeps itself (rota.cli.stepfiles.Files)
        self.key = os.urandom(24).hex()
        self.lock = _thread.allocate_lock()
        self.conns: list[socket.socket] = []
        self.ends: dict[int, tuple[int, int]] = {}
        self.where: dict[int, str] = {}
        self.partial: dict[tuple[int, int], bytes] = {}
        self.done = _Latch()
        self.step_id = -1
        self.ntasks = 0
        self.interrupted = 0.0
        self.first_end = 0.0          # when the first task ended (``--wait`` counts from it)
        self.early: dict[int, tuple[int, int]] = {}   # tasks ended, heard as they end (before their node reports)

    def run(self) -> int:
        address = _my_address()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((address, 0))       # the address the nodes reach, not every interface
        except OSError as exc:
            raise SrunError(f"srun: error: cannot listen on {address} for the step's nodes: {exc.strerror or exc} "
                            "(set ROTA_SRUN_HOST to this host's address the nodes reach)") from None
        listener.listen(1024)
        self.body.update(io=f"{address}:{listener.getsockname()[1]}", io_key=self.key)
        self._install_signals()
        reply = self._create()
        self.step_id, self.ntasks = int(reply["step_id"]), int(reply["ntasks"])
        if self.files is not None and self.files.given:
            try:
                self.files.open(self.job_id, self.step_id)
            except OSError as exc:
                raise SrunError(f"srun: error: {exc}") from None
            self.out = self.files.out or self.out
        for node, tasks in zip(reply["nodes"], reply["tasks"]):
            for t in tasks:
                self.where[t] = node
        if self.values.get("verbose"):
            self.err.write(_job_information(self.job_id, reply, _count(self.values, "cpus_per_task", "-c") or 1))
            self.err.write(_launching(f"{self.job_id}.{self.step_id}", reply))
            self.err.flush()
        self._meet(listener, len(reply["nodes"]))
        _thread.start_new_thread(self._stdin, ())
        given = str(self.values.get("wait") or "0")
        wait = int(given) if given.isdecimal() else 0     # 0: wait for every task, as without --wait
        kill_on_bad = self.values.get("kill_on_bad_exit") not in (None, "0")
        while not self.done.wait(0.2):
            if wait and self.first_end and time.monotonic() - self.first_end >= wait:
                self._end_the_rest(wait)
                wait = 0
            if kill_on_bad and any(code or sig for code, sig in [*self.early.values(), *self.ends.values()]):
                self._end_the_rest(0)      # -K: a task that failed ends the step
                kill_on_bad = False
        try:
            return self._result()
        finally:
            if self.files is not None:
                self.files.close()

    def _end_the_rest(self, wait: int) -> None:
        """``--wait``: the first task ended that long ago (0: ``-K``, one failed); the others are killed, as Slurm's
        srun does."""
        step = f"StepId={self.job_id}.{self.step_id}"
        running = [t for t in sorted(self.where) if t not in self.ends and t not in self.early]
        if wait:
            self.err.write(f"srun: First task exited {wait}s ago\n")
            self.err.write(f"srun: {step} tasks {_ranges(running)}: running\n" if running else "")
        self.err.write(f"srun: Terminating {step}\n")
        self.err.flush()
        self._send_all(stepio.SIGNAL, stepio.ALL_TASKS, str(int(signal.SIGKILL)).encode())

    def _create(self) -> dict:
        from .client import request

        said_busy = False
        while True:
            reply = request("step_create", self.body)
            if reply.get("ok"):
                if said_busy:
                    self.err.write(f"srun: Step created for StepId={self.job_id}.{reply['step_id']}\n")
                for w in reply.get("warnings") or ():
                    self.err.write(f"srun: Warning: {w}\n")
                return reply
            words = (reply.get("error") or ["unknown error"])[-1]
            if reply.get("code") == "busy":
                if not said_busy:
                    self.err.write(f"srun: Job {self.job_id} step creation temporarily disabled, retrying ({words})\n")
                    self.err.flush()
                    said_busy = True
                time.sleep(BUSY_RETRY)
                continue
            raise SrunError(f"srun: error: Unable to create step for job {self.job_id}: {words}")

    def _meet(self, listener: socket.socket, nodes: int) -> None:
        """Meet each node's agent: every connection is greeted at once and must prove the step's key within
        HELLO_WAIT seconds (see :mod:`rota.wire.stepio`), all of them at the same time, so a connection that
        says nothing, or the wrong thing, delays no one and is dropped; then read each node's frames in a
        thread."""
        import select

        listener.setblocking(False)
        poll = select.poll()
        poll.register(listener.fileno(), select.POLLIN)
        waiting: dict[int, tuple[socket.socket, str, float, bytes]] = {}   # fd -> (conn, nonce, deadline, read)
        deadline = time.monotonic() + CONNECT_TIMEOUT
        met: set[str] = set()
        while len(met) < nodes:
            now = time.monotonic()
            if now > deadline:
                for conn, *_ in waiting.values():
                    conn.close()
                listener.close()
                raise SrunError(f"srun: error: the step's nodes did not connect within {CONNECT_TIMEOUT:.0f} s")
            for fd in [fd for fd, w in waiting.items() if w[2] < now]:
                self._drop(poll, waiting, fd)
            for fd, _ in poll.poll(200):
                if fd == listener.fileno():
                    self._greet(listener, poll, waiting, now)
                elif fd in waiting:
                    self._hello(poll, waiting, fd, met)
        for fd in list(waiting):
            self._drop(poll, waiting, fd)
        listener.close()

    def _greet(self, listener: socket.socket, poll, waiting: dict, now: float) -> None:
        for _ in range(64):
            try:
                fd, _addr = listener._accept()   # type: ignore[attr-defined]  # the C socket's accept: (fd, address)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            conn = socket.socket(fileno=fd)
            conn.setblocking(False)
            nonce = os.urandom(16).hex()
            try:
                conn.send(stepio.greeting(self.key, nonce))
            except OSError:
                conn.close()
                continue
            if len(waiting) >= MAX_UNPROVEN:     # the oldest unproven connection makes room
                self._drop(poll, waiting, min(waiting, key=lambda f: waiting[f][2]))
            waiting[fd] = (conn, nonce, now + HELLO_WAIT, b"")
            poll.register(fd, 1)                 # POLLIN

    def _hello(self, poll, waiting: dict, fd: int, met: set[str]) -> None:
        conn, nonce, until, got = waiting[fd]
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        got += chunk
        if not chunk or (b"\n" not in got and len(got) > 4096):
            self._drop(poll, waiting, fd)
            return
        if b"\n" not in got:
            waiting[fd] = (conn, nonce, until, got)
            return
        try:
            hello = lightjson.loads(got.split(b"\n", 1)[0].decode())
        except ValueError:
            hello = None
        node = str(hello.get("node", "")) if isinstance(hello, dict) else ""
        if not node or node in met or not _same(str(hello.get("proof", "")), stepio.proof(self.key, nonce, node)):
            self._drop(poll, waiting, fd)        # not one of this step's nodes
            return
        poll.unregister(fd)
        del waiting[fd]
        try:
            conn.setblocking(True)
            conn.sendall(b"ok\n")
        except OSError:
            conn.close()
            return
        met.add(node)
        self.conns.append(conn)
        _thread.start_new_thread(self._read, (conn, node))

    @staticmethod
    def _drop(poll, waiting: dict, fd: int) -> None:
        conn = waiting.pop(fd)[0]
        try:
            poll.unregister(fd)
        except KeyError:
            pass
        conn.close()

    def _read(self, conn: socket.socket, node: str) -> None:
        try:
            while True:
                head = _recv_exactly(conn, stepio.HEADER.size)
                if len(head) < stepio.HEADER.size:
                    break
                kind, rank, size = stepio.HEADER.unpack(head)
                data = _recv_exactly(conn, size) if size else b""
                if kind in (stepio.STDOUT, stepio.STDERR):
                    self._write(kind, rank, data)
                elif kind == stepio.EXIT:
                    self._ended(rank, *stepio.parse_exit(data))
                elif kind == stepio.TASK_ENDED:
                    with self.lock:
                        self.early[rank] = stepio.parse_exit(data)
                        self.first_end = self.first_end or time.monotonic()
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                lost = [t for t, n in self.where.items() if n == node and t not in self.ends]
                for t in lost:
                    self.ends[t] = (1, 0)
                    self.err.write(f"srun: error: {node}: task {t}: lost (its node's agent went away)\n")
            self._check_done()

    def _write(self, kind: int, rank: int, data: bytes) -> None:
        with self.lock:
            if self.body.get("label"):
                buf = self.partial.pop((kind, rank), b"") + data
                *lines, rest = buf.split(b"\n")
                if rest:
                    self.partial[(kind, rank)] = rest
                data = b"".join(b"%d: %s\n" % (rank, line) for line in lines)
            self._put(kind, data)

    def _put(self, kind: int, data: bytes) -> None:
        """Write a task's bytes to srun's stdout or stderr, at once (``--unbuffered`` is how srun always relays)."""
        if kind == stepio.STDOUT:
            self.out.write(data)
            self.out.flush()
            return
        sink = self.files.err if self.files is not None and self.files.err is not None else getattr(self.err, "buffer", None)
        if sink is None:
            self.err.write(data.decode(errors="replace"))
        else:
            self.err.flush()
            sink.write(data)
            sink.flush()

    def _ended(self, rank: int, code: int, sig: int) -> None:
        with self.lock:
            for kind in (stepio.STDOUT, stepio.STDERR):
                rest = self.partial.pop((kind, rank), b"")
                if rest:
                    self._put(kind, b"%d: %s\n" % (rank, rest))
            self.ends[rank] = (code, sig)
            self.first_end = self.first_end or time.monotonic()
        self._check_done()

    def _check_done(self) -> None:
        if len(self.ends) >= self.ntasks:
            self.done.set()

    def _result(self) -> int:
        """Slurm's words for each task that failed, and the exit status: the highest code, 128+N for signal N."""
        worst = 0
        self.err.flush()
        failed: dict[tuple[str, int, int], list[int]] = {}      # (node, code, signal) -> its tasks, as Slurm groups them
        for rank in sorted(self.ends):
            code, sig = self.ends[rank]
            if sig or code:
                failed.setdefault((self.where.get(rank, "?"), code, sig), []).append(rank)
                worst = max(worst, 128 + sig if sig else code)
        for (node, code, sig), ranks in sorted(failed.items(), key=lambda kv: (kv[0][0], kv[1][0])):
            tasks = f"task {ranks[0]}" if len(ranks) == 1 else f"tasks {_ranges(ranks)}"
            words = _signal_words(sig) if sig else f"Exited with exit code {code}"
            self.err.write(f"srun: error: {node}: {tasks}: {words}\n")
        self.err.flush()
        return worst

    def _send_all(self, kind: int, task: int, data: bytes = b"") -> None:
        frame = stepio.frame(kind, task, data)
        for c in list(self.conns):
            try:
                c.sendall(frame)
            except OSError:
                pass

    def _stdin(self) -> None:
        """Forward srun's stdin to every task (Slurm's default), then its end."""
        try:
            fd = self.files.stdin_fd if self.files is not None and self.files.stdin_fd is not None else sys.stdin.fileno()
        except (AttributeError, ValueError, OSError):
            self._send_all(stepio.STDIN_EOF, stepio.ALL_TASKS)
            return
        while not self.done.is_set():
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                self._send_all(stepio.STDIN_EOF, stepio.ALL_TASKS)
                return
            self._send_all(stepio.STDIN, stepio.ALL_TASKS, data)

    def _install_signals(self) -> None:
        if _thread.get_ident() != _MAIN_THREAD:
            return
        signal.signal(signal.SIGINT, self._on_interrupt)
        for sig in _FORWARDED:
            signal.signal(sig, self._forward)

    def _forward(self, signum: int, _frame: object) -> None:
        self._send_all(stepio.SIGNAL, stepio.ALL_TASKS, str(signum).encode())

    def _on_interrupt(self, _signum: int, _frame: object) -> None:
        """Slurm's Ctrl-C: the first says which tasks run; a second within a second sends Ctrl-C to every
        task; one more kills them (``--quit-on-interrupt``: the first kills)."""
        now = time.monotonic()
        step = f"StepId={self.job_id}.{self.step_id}"
        if self.values.get("quit_on_interrupt") or self.interrupted < 0:
            self.err.write("srun: forcing job termination\n")
            self._send_all(stepio.SIGNAL, stepio.ALL_TASKS, str(int(signal.SIGKILL)).encode())
        elif self.interrupted and now - self.interrupted <= 1.0:
            self.err.write(f"srun: sending Ctrl-C to {step}\n")
            self._send_all(stepio.SIGNAL, stepio.ALL_TASKS, str(int(signal.SIGINT)).encode())
            self.interrupted = -1.0
        else:
            running = [t for t in sorted(self.where) if t not in self.ends]
            self.err.write("srun: interrupt (one more within 1 sec to abort)\n")
            self.err.write(f"srun: {step} tasks {_ranges(running)}: running\n" if running else "")
            self.interrupted = now
        self.err.flush()


def _same(given: str, key: str) -> bool:
    """The step's key, compared in time that does not depend on where they differ."""
    a, b = given.encode(), key.encode()
    return len(a) == len(b) and not sum(x ^ y for x, y in zip(a, b))


_MAIN_THREAD = _thread.get_ident()


class _Latch:
    """Set once, waited on with a timeout (threading.Event's part srun needs, on a bare lock)."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        if self._lock.acquire(True, timeout):
            self._lock.release()
        return self._set


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``conn`` (fewer only when it closes)."""
    parts, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _my_address() -> str:
    """The IPv4 address the step's nodes reach this srun at (it listens there alone): ``ROTA_SRUN_HOST``, else
    what this host's name resolves to."""
    name = os.environ.get("ROTA_SRUN_HOST") or socket.gethostname() or "127.0.0.1"
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        raise SrunError(f"srun: error: cannot find the address of {name} (set ROTA_SRUN_HOST to this host's "
                        "address the nodes reach)") from None


def _signal_words(sig: int) -> str:
    return {9: "Killed", 15: "Terminated", 2: "Interrupt", 6: "Aborted", 11: "Segmentation fault",
            1: "Hangup", 3: "Quit"}.get(sig, f"Killed by signal {sig}")


def _ranges(ranks: list[int]) -> str:
    if not ranks:
        return ""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:] + [-2]:
        if r != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = r
        prev = r
    return ",".join(parts)


def main_exit() -> None:
    from .exits import exit_with

    exit_with(main, at_once=True)


if __name__ == "__main__":
    main_exit()
