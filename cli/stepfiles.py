"""``srun -o/-e/-i FILE`` that names one file for the whole step: srun itself writes (or reads) it, as Slurm's
srun does, so that every task's output lands in it whatever node the task ran on. A name that differs per task
or node (``%t``, ``%n``, ``%N``) is opened by each node for its own tasks."""
from __future__ import annotations

import os
import re
from typing import BinaryIO

PER_TASK = re.compile(r"%\d*[tnN]")
STREAMS = ("output", "error", "input")


def srun_side(value: object) -> bool:
    """Whether srun opens this ``-o``/``-e``/``-i`` value itself."""
    return isinstance(value, str) and value not in ("none", "") and not PER_TASK.search(value)


def expand(pattern: str, job_id: int, step_id: int, name: str) -> str:
    """Slurm's step-wide patterns: ``%j`` job, ``%J`` job.step, ``%s`` step, ``%u`` user, ``%x`` the job's name,
    ``%%``."""
    import pwd

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    fields = {"j": str(job_id), "J": f"{job_id}.{step_id}", "s": str(step_id), "u": user, "x": name, "%": "%"}

    def one(m: re.Match) -> str:
        text = fields.get(m.group(2))
        return m.group(0) if text is None else text.rjust(int(m.group(1))) if m.group(1) else text

    return re.sub(r"%(\d*)([jJsux%])", one, pattern)


class Files:
    """The streams srun keeps for a step: where tasks' stdout and stderr go, where their stdin comes from."""

    def __init__(self, given: dict[str, str], job_name: str = "") -> None:
        self.given, self.job_name = given, job_name
        self.out: BinaryIO | None = None
        self.err: BinaryIO | None = None
        self.stdin_fd: int | None = None

    def open(self, job_id: int, step_id: int) -> None:
        """Open the files now that the step has its id (output and error the same file: one)."""
        paths = {k: expand(v, job_id, step_id, self.job_name) for k, v in self.given.items()}
        try:
            if "output" in paths:
                self.out = open(paths["output"], "wb")      # kept open for the step's life
            if "error" in paths:
                self.err = self.out if paths.get("output") == paths["error"] else open(paths["error"], "wb")
            if "input" in paths:
                self.stdin_fd = os.open(paths["input"], os.O_RDONLY)
        except OSError as exc:
            raise OSError(f"cannot open {exc.filename}: {exc.strerror}") from None

    def close(self) -> None:
        for f in {id(f): f for f in (self.out, self.err) if f is not None}.values():
            f.close()
        if self.stdin_fd is not None:
            os.close(self.stdin_fd)
