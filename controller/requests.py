"""One request model per API verb: typed, bounded, unknown fields refused.

The body of every request is validated here (straight from its JSON bytes, so a recursion bomb or
a 10 MB string is refused by the parser) before any handler sees it. A submit's job carries no
identity: the controller adds the caller's uid, gid and name from the credential.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Awaitable, Callable, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from rota.core.auth import Caller
from rota.core.events import JobSpec
from rota.wire.subjects import MAX_BATCH
from rota.core.limits import MAX_COUNT, MAX_LIST, MAX_NAME, MAX_NICE, MAX_PATH, MAX_TIME, control_free

if TYPE_CHECKING:
    from .port import ControllerPort
    from .replies import Raw


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _printable(text: str) -> str:
    if not control_free(text):
        raise ValueError("control characters are not allowed")
    return text


JobId = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Name = Annotated[str, Field(max_length=MAX_NAME), AfterValidator(_printable)]
NodeName = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_printable)]
Arg = Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_printable)]
Filter = Annotated[str, Field(max_length=MAX_LIST), AfterValidator(_printable)]

IDENTITY = ("user", "uid", "gid")


def _no_identity(spec: Any) -> Any:
    """A job as a client may describe it: everything but who submits it (that comes from the credential)."""
    if isinstance(spec, dict):
        named = [k for k in IDENTITY if k in spec]
        if named:
            raise ValueError(f"{named[0]}: Extra inputs are not permitted (who submits a job comes from "
                             "the caller's credential)")
    return spec


JobSpecIn = Annotated[JobSpec, BeforeValidator(_no_identity)]


class NoArgs(Request):
    pass


class Submit(Request):
    spec: JobSpecIn


class SubmitMany(Request):
    specs: list[JobSpecIn] = Field(min_length=1, max_length=MAX_BATCH)


class JobStates(Request):
    job_ids: list[JobId] = Field(min_length=1, max_length=MAX_BATCH)


class JobOnly(Request):
    job_id: JobId


class Jobs(Request):
    array_job_id: JobId | None = None   # only this array's tasks (``scontrol show job`` of an array's id)


class Cancel(Request):
    job_id: JobId
    tasks: tuple[Annotated[int, Field(ge=0, le=MAX_COUNT)], ...] | None = Field(None, max_length=MAX_LIST)
    signal: int = Field(15, ge=1, le=64)


class Signal(Request):
    job_id: JobId
    signal: int = Field(15, ge=1, le=64)
    batch: bool = True               # to the batch shell's processes
    steps: bool = True               # to the steps' tasks
    step_id: int | None = Field(None, ge=0, le=MAX_COUNT)


def _io_address(text: str) -> str:
    """Where a step's srun listens: ``host:port``, an unprivileged port (the agents connect there as root)."""
    host, sep, port = text.rpartition(":")
    if text and (not sep or not host or not port.isdecimal() or not 1024 <= int(port) <= 65535
                 or not all(c.isalnum() or c in "._-" for c in host)):
        raise ValueError("io must be HOST:PORT with a port from 1024 to 65535")
    return text


Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
EnvValue = Annotated[str, Field(max_length=1 << 16)]


class StepCreate(Request):
    """``srun`` inside an allocation: what to run, how to spread it, and where its ``srun`` listens."""

    job_id: JobId
    name: Name = ""
    argv: tuple[Arg, ...] = Field(min_length=1, max_length=MAX_LIST)
    workdir: Arg = "/"
    env: dict[Name, EnvValue] = Field(default_factory=dict, max_length=4096)
    ntasks: Count | None = None
    nodes: Count | None = None
    ntasks_per_node: Count | None = None
    cpus_per_task: Count | None = None
    gpus_per_task: Count | None = None
    gpus_per_node: Count | None = None
    mem: int | None = Field(None, ge=0, le=1 << 40)
    nodelist: tuple[NodeName, ...] = Field((), max_length=MAX_LIST)
    overlap: bool = False
    overcommit: bool = False
    io: Annotated[str, Field(max_length=300), AfterValidator(_io_address)] = ""
    io_key: Annotated[str, Field(pattern=r"^([0-9a-f]{32,128})?$")] = ""
    output: Arg | None = None
    error: Arg | None = None
    input: Arg | None = None
    label: bool = False


class AccountingChange(Request):
    """``sacctmgr add|modify|delete account|user|qos NAMES [where ...] [set ...]`` (keys lower-cased)."""

    op: Literal["add", "modify", "delete"]
    entity: Literal["account", "user", "qos"]
    names: tuple[Name, ...] = Field((), max_length=MAX_LIST)
    where: dict[Name, Filter] = Field(default_factory=dict, max_length=64)
    values: dict[Name, Filter] = Field(default_factory=dict, max_length=64)


class ReleaseAllocation(Request):
    """``srun``/``salloc`` giving back the allocation it asked for: the job ends with this exit code."""

    job_id: JobId
    exit_code: int = Field(0, ge=0, le=255)
    signal: int = Field(0, ge=0, le=64)


class Hold(Request):
    job_id: JobId
    user_hold: bool = False          # ``uhold``: always the user's hold


class Requeue(Request):
    job_id: JobId
    hold: bool = False


class UpdateJob(Request):
    job_id: JobId
    time_limit: int | None = Field(None, ge=0, le=MAX_TIME)
    priority: int | None = Field(None, ge=0, le=MAX_COUNT)
    nice: int | None = Field(None, ge=-MAX_NICE, le=MAX_NICE)


class NodeChange(Request):
    node: NodeName
    reason: Name = ""


class Squeue(Request):
    jobs: Filter | None = None
    users: Filter | None = None
    partitions: Filter | None = None
    states: Filter | None = None
    format: Filter | None = None
    Format: Filter | None = None
    noheader: bool = False
    long: bool = False
    start: bool = False
    me: bool = False                 # the caller's own jobs (its uid, from the credential)
    names: Filter | None = None      # -n: job names
    nodelist: Filter | None = None   # -w: jobs running on any of these nodes (a hostlist)
    array: bool = False              # -r: an array's pending tasks one per line
    sort: Filter | None = None       # -S: sort fields
    clusters: Filter | None = None   # -M: this cluster's name, or all
    steps: bool | Filter | None = None   # -s: the running steps (of these, when given: "7.0,8")


class Accounting(Request):
    command: Literal["sacct", "sinfo", "scontrol", "report"]
    argv: tuple[Arg, ...] = Field((), max_length=256)


class TimeTravel(Request):
    command: Literal["why", "replay", "verify", "whatif", "history"]
    argv: tuple[Arg, ...] = Field((), max_length=64)


def first_problem(exc: Any) -> str:
    """One readable line for a pydantic ValidationError: where and what."""
    errors = exc.errors(include_url=False) if hasattr(exc, "errors") else []
    if not errors:
        return str(exc).splitlines()[0]
    e = errors[0]
    where = ".".join(str(p) for p in e.get("loc", ())) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {e.get('msg', 'invalid')}{more}"


# ---------------------------------------------------------------- a verb: name -> request model, handler

R = TypeVar("R", bound=Request)


@dataclass(frozen=True, slots=True)
class Verb(Generic[R]):
    """One API verb: its name, the model its body must fit, and the handler that answers it."""
    name: str
    model: type[R]
    handler: Callable[[ControllerPort, Caller, R, str], Awaitable[dict | Raw]]
    writes: bool = False      # changes the log: a retry with the same request id gets the first answer
    elsewhere: bool = False   # answered in another thread or process: the event loop is free meanwhile
