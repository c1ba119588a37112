"""``sinfo``: partitions and nodes from the projection database, in Slurm's layouts."""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

from rota.core.hostlist import compress, expand
from rota.projections import queries

from .options import NO, REQUIRED, OptionError, unsupported, table
from .options import parse as read_options
from rota.wire.formats import Column, time_limit, timestamp

DEFAULT = "%#P %.5a %.10l %.6D %.6t %N"
NODE_DEFAULT = "%#N %.6D %#P %6t"
REASONS = "%20E %9u %19H %N"
LONG = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
SUMMARIZE = "%9P %.5a %.10l %.16F  %N"
NODE_LONG = "%#N %.6D %#P %11T %.4c %.8z %.6m %.8d %.6w %.8f %20E"

# Slurm orders groups by state value, flags included (DRAIN 0x200, NOT_RESPONDING 0x800), highest first.
BASE_VALUE = {"UNKNOWN": 0, "DOWN": 1, "IDLE": 2, "ALLOCATED": 3, "MIXED": 5}
SHORT = {"UNKNOWN": "unk", "DOWN": "down", "IDLE": "idle", "ALLOCATED": "alloc", "MIXED": "mix"}
LONG_NAMES = {"UNKNOWN": "unknown", "DOWN": "down", "IDLE": "idle", "ALLOCATED": "allocated", "MIXED": "mixed"}
_SPEC = re.compile(r"%(#?)(\.?)(\d*)([A-Za-z])")


class Usage(Exception):
    pass


def _state(n: queries.Row, names: dict[str, str], drained: str, draining: str, planned: dict[str, str]) -> str:
    base = n["base"]
    if n["drain"]:
        s = drained if base in ("IDLE", "DOWN", "UNKNOWN") else draining
    elif n["not_responding"]:
        return names.get(base, base.lower()) + "*"
    elif base in planned and "planned" in n.keys() and n["planned"]:
        return planned[base]
    else:
        s = names.get(base, base.lower())
    return s + ("*" if n["not_responding"] else "")


def state_short(n: queries.Row) -> str:
    """%t: idle, mix, alloc, drain, drng, down, unk (+ "*" when not responding); plnd for an idle node kept for a
    pending job (Slurm's PLANNED)."""
    return _state(n, SHORT, "drain", "drng", {"IDLE": "plnd"})


def state_long(n: queries.Row) -> str:
    """%T: idle, mixed, allocated, drained, draining, down, unknown (+ "*"); planned for an idle node kept for a
    pending job."""
    return _state(n, LONG_NAMES, "drained", "draining", {"IDLE": "planned"})


def state_value(n: queries.Row) -> int:
    return BASE_VALUE.get(n["base"], 0) + (0x200 if n["drain"] else 0) + (0x800 if n["not_responding"] else 0)


def _partition(code: str) -> Any:
    """%P (the default partition starred) and %R: the group's partition, or n/a."""
    def value(part: queries.Row | None, nodes: list[queries.Row]) -> str:
        if part is None:
            return "n/a"
        return part["name"] + ("*" if part["is_default"] and code == "P" else "")
    return value


def _avail(part: queries.Row | None, nodes: list[queries.Row]) -> str:
    if part is None:
        return "n/a"
    return {"UP": "up", "DOWN": "down", "DRAIN": "drain", "INACTIVE": "inact"}.get(part["state"], "up")


def _node_counts(part: queries.Row | None, nodes: list[queries.Row]) -> str:
    """%F: nodes allocated (or mixed) / idle / other (down, drained, unknown) / total."""
    alloc = sum(1 for x in nodes if x["base"] in ("ALLOCATED", "MIXED"))
    idle = sum(1 for x in nodes if x["base"] == "IDLE" and not x["drain"])
    return f"{alloc}/{idle}/{len(nodes) - alloc - idle}/{len(nodes)}"


def _cpu_counts(part: queries.Row | None, nodes: list[queries.Row]) -> str:
    """%C: CPUs allocated / idle / other / total."""
    alloc = sum(x["alloc_cpus"] for x in nodes)
    total = sum(x["cpus"] for x in nodes)
    other = sum(x["cpus"] for x in nodes if x["drain"] or x["base"] == "DOWN")
    return f"{alloc}/{total - alloc - other}/{other}/{total}"


def _first(text: Any) -> Any:
    """A column from a group's first node (the nodes of a group agree on what it shows)."""
    return lambda part, nodes: text(nodes[0])


def _names(part: queries.Row | None, nodes: list[queries.Row]) -> str:
    return compress([x["name"] for x in nodes])


# sinfo's -o specifiers: a column over one group (a partition, or none, and the nodes that show alike in it)
COLUMNS: dict[str, Column] = {
    "P": Column("PARTITION", _partition("P")), "R": Column("PARTITION", _partition("R")),
    "a": Column("AVAIL", _avail),
    "l": Column("TIMELIMIT", lambda part, nodes: time_limit(part["max_time"]) if part is not None else "n/a"),
    "D": Column("NODES", lambda part, nodes: str(len(nodes))),
    "t": Column("STATE", _first(state_short)), "T": Column("STATE", _first(state_long)),
    "N": Column("NODELIST", _names), "n": Column("HOSTNAMES", _names),
    "E": Column("REASON", _first(lambda n: n["reason"] or "none")),
    "u": Column("USER", _first(lambda n: n["reason_by"] or "Unknown")),
    "H": Column("TIMESTAMP", _first(lambda n: timestamp(n["reason_time"]) if n["reason"] else "Unknown")),
    "G": Column("GRES", _first(lambda n: n["gres"] or "(null)")),
    "c": Column("CPUS", _first(lambda n: str(n["cpus"]))),
    "F": Column("NODES(A/I/O/T)", _node_counts), "C": Column("CPUS(A/I/O/T)", _cpu_counts),
    "m": Column("MEMORY", _first(lambda n: str(n["memory"]))),
    "e": Column("FREE_MEM", _first(lambda n: str(max(0, n["memory"] - n["alloc_mem"])))),
    "f": Column("AVAIL_FEATURES", _first(lambda n: n["features"] or "(null)")),
    "z": Column("S:C:T", _first(lambda n: f"1:{n['cpus']}:1")),
    "d": Column("TMP_DISK", lambda part, nodes: "0"),
    "w": Column("WEIGHT", _first(lambda n: str(n["weight"] or 1))),
    "s": Column("JOB_SIZE", lambda part, nodes: "1-infinite"),
    "r": Column("ROOT", lambda part, nodes: "no"), "g": Column("GROUPS", lambda part, nodes: "all"),
    "h": Column("OVERSUBSCRIBE", lambda part, nodes: "NO"), "O": Column("CPU_LOAD", lambda part, nodes: "N/A"),
}


def parse(fmt: str) -> list[tuple[str, Any]]:
    """Literal text and (code, width, right, natural) specs, like squeue's."""
    out: list = []
    pos = 0
    for m in _SPEC.finditer(fmt):
        if m.start() > pos:
            out.append(("lit", fmt[pos:m.start()]))
        hash_, dot, width, code = m.groups()
        if code not in COLUMNS:
            raise Usage(f"sinfo: error: Invalid node format specification: {m.group(0)}")
        out.append(("spec", (code, int(width) if width else None, bool(dot), bool(hash_))))
        pos = m.end()
    if pos < len(fmt):
        out.append(("lit", fmt[pos:]))
    return out


def render(spec, groups: list[tuple[queries.Row | None, list[queries.Row]]], header: bool) -> list[str]:
    values = [[COLUMNS[s[0]].value(part, nodes) if kind == "spec" else s for kind, s in spec]
              for part, nodes in groups]
    # %#X: width of the longest value (and header)
    widths: list[int | None] = []
    for i, (kind, s) in enumerate(spec):
        if kind != "spec":
            widths.append(None)
            continue
        code, width, _right, natural = s
        if natural:
            width = max([len(COLUMNS[code].header)] + [len(v[i]) for v in values])
        widths.append(width)

    def line(cells: list[str]) -> str:
        out = []
        for i, (kind, s) in enumerate(spec):
            if kind != "spec":
                out.append(s)
                continue
            text, w, right = cells[i], widths[i], s[2]
            if w is not None:
                text = text[:w]
                text = text.rjust(w) if right else text.ljust(w)
            out.append(text)
        return "".join(out).rstrip() if spec and spec[-1][0] == "spec" and spec[-1][1][1] is None else "".join(out)

    lines = []
    if header:
        lines.append(line([COLUMNS[s[0]].header if kind == "spec" else s for kind, s in spec]))
    lines += [line(v) for v in values]
    return lines


# sinfo's options (Slurm 22.05), read as getopt_long reads them (see rota.cli.options)
OPTIONS = table(
    ("a", "all", NO, "all"), ("d", "dead", NO, "!dead"), ("e", "exact", NO, "~exact"),
    ("", "federation", NO, "~federation"), ("h", "noheader", NO, "noheader"), ("", "help", NO, "help"),
    ("", "hide", NO, "~hide"), ("i", "iterate", REQUIRED, "!iterate"), ("", "json", NO, "!json"),
    ("l", "long", NO, "long"), ("", "local", NO, "local"), ("M", "clusters", REQUIRED, "clusters"),
    ("n", "nodes", REQUIRED, "nodes"), ("", "noconvert", NO, "noconvert"), ("N", "Node", NO, "Node"),
    ("o", "format", REQUIRED, "format"), ("O", "Format", REQUIRED, "!Format"), ("p", "partition", REQUIRED, "partition"),
    ("r", "responding", NO, "!responding"), ("R", "list-reasons", NO, "list_reasons"),
    ("s", "summarize", NO, "summarize"), ("S", "sort", REQUIRED, "!sort"), ("t", "states", REQUIRED, "states"),
    ("T", "reservation", NO, "!reservation"), ("", "usage", NO, "usage"), ("v", "verbose", NO, "verbose"),
    ("V", "version", NO, "version"), ("", "yaml", NO, "!yaml"))


class _Options:
    def __init__(self, values: dict) -> None:
        self.values = values

    def __getattr__(self, name: str):
        return self.values.get(name)


def run(argv: list[str], out=sys.stdout, err=sys.stderr, *, db: str | None = None, uid: int | None = None) -> int:
    """sinfo over the projection database ``db`` (default: the local cluster's; when this user cannot
    read it, the controller answers from its own)."""
    try:
        values, operands = read_options("sinfo", argv, OPTIONS)
        warnings = unsupported("sinfo", values)
    except OptionError as exc:
        err.write(f"{exc}\nTry \"sinfo --help\" for more information\n")
        return 1
    ns = _Options(values)
    from .helptext import answered

    if answered("sinfo", values, OPTIONS, out):
        return 0
    if operands:
        err.write(f"sinfo: error: unexpected argument '{operands[0]}'\nTry \"sinfo --help\" for more information\n")
        return 1
    for warning in warnings:
        err.write(warning + "\n")
    from rota.wire.paths import projections_db

    path = db or projections_db()
    if not os.access(path, os.R_OK):
        if db is None:   # the projection is the administrator's: the controller answers
            from .client import remote_command

            return remote_command("sinfo", argv, out, err)
        err.write(f"sinfo: error: no rota cluster state at {path}; is `rota up` running (or ROTA_STATE_DIR "
                  "set)?\n")
        return 1
    conn = queries.connect(path)
    try:
        nodes, parts = _selected(ns, queries.nodes(conn), queries.partitions(conn))
        if ns.clusters:
            lines = _cluster_heading(ns, queries.cluster_name(conn))
        else:
            lines = []
        if ns.list_reasons:
            lines += _reasons(ns, nodes)
        elif ns.Node:
            lines += _by_node(ns, nodes, parts)
        else:
            lines += _by_partition(ns, nodes, parts)
    except Usage as exc:
        err.write(f"{exc}\n")
        return 1
    for line in lines:
        out.write(line + "\n")
    return 0


def _cluster_heading(ns: _Options, name: str) -> list[str]:
    """``-M``: this cluster's heading, or Slurm's refusal of a cluster that is not this one."""
    from rota.wire.clusters import heading, refusal, unknown

    bad = unknown(ns.clusters, name)
    if bad:
        raise Usage(refusal("sinfo", bad))
    return [] if ns.noheader else [heading(name)]


def _selected(ns: _Options, nodes: list, parts: list) -> tuple[list, list]:
    """The nodes and partitions --partition, --nodes and --states select."""
    if ns.partition:
        wanted = set(ns.partition.split(","))
        parts = [p for p in parts if p["name"] in wanted]
    if ns.nodes:
        try:
            keep = set(expand(ns.nodes))
        except ValueError as exc:
            raise Usage(f"sinfo: error: Invalid node name specified: {exc}") from None
        nodes = [n for n in nodes if n["name"] in keep]
    if ns.states:
        states = {s.strip().lower() for s in ns.states.split(",")}
        nodes = [n for n in nodes if state_short(n).rstrip("*") in states or state_long(n).rstrip("*") in states
                 or (n["drain"] and "drain" in states)]
    return nodes, parts


def _reasons(ns: _Options, nodes: list) -> list[str]:
    """``sinfo -R``: drained and down nodes grouped by their reason."""
    spec = parse(ns.format or REASONS)
    groups: dict[tuple, list] = {}
    for n in nodes:
        if n["reason"] and (n["drain"] or n["base"] == "DOWN"):
            groups.setdefault((n["reason"], n["reason_by"], n["reason_time"]), []).append(n)
    return render(spec, [(None, g) for g in groups.values()], not ns.noheader)


def _by_node(ns: _Options, nodes: list, parts: list) -> list[str]:
    """``sinfo -N``: a line per node and partition."""
    spec = parse(ns.format or (NODE_LONG if ns.long else NODE_DEFAULT))
    by_name = {n["name"]: n for n in nodes}
    rows = [(p, [by_name[name]]) for name in by_name for p in parts if name in (p["nodes"] or "").split(",")]
    rows.sort(key=lambda pn: pn[1][0]["idx"])
    lines = render(spec, rows, not ns.noheader)
    if ns.long and not ns.format:
        lines.insert(0, time.strftime("%a %b %d %H:%M:%S %Y"))
    return lines


def _by_partition(ns: _Options, nodes: list, parts: list) -> list[str]:
    """Plain ``sinfo``: a line per partition and node state (``-s``: a line per partition)."""
    spec = parse(ns.format or (SUMMARIZE if ns.summarize else LONG if ns.long else DEFAULT))
    rows = []
    for p in parts:
        members = set((p["nodes"] or "").split(","))
        if ns.summarize:
            rows.append((p, [n for n in nodes if n["name"] in members]))
            continue
        grouped: dict[tuple, list] = {}
        for n in nodes:
            if n["name"] in members:
                grouped.setdefault((state_short(n), n["reason"] if ns.format and "%E" in ns.format else None),
                                   []).append(n)
        for g in sorted(grouped.values(), key=lambda g: -state_value(g[0])):
            rows.append((p, g))
    lines = render(spec, rows, not ns.noheader)
    if ns.long and not ns.format:
        lines.insert(0, time.strftime("%a %b %d %H:%M:%S %Y"))
    return lines


def main_exit() -> None:
    from .exits import exit_with

    exit_with(run)


if __name__ == "__main__":
    main_exit()
