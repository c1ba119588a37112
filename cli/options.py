"""Command-line options read the way Slurm's commands read them: GNU ``getopt_long``.

Slurm's commands accept unique prefixes of long options (``--part`` for ``--partition``),
``--opt=value`` and ``--opt value``, ``-pvalue`` and ``-p value``, bundled flags (``-Hv``) and
``--`` to end options, and they word their errors the way glibc does (the golden outputs in
``slurm-golden/sbatch_errors.txt``). ``argparse`` differs on all of these and costs a few ms to
import in commands that tools run thousands of times, so this is a small table-driven reader.
"""
from __future__ import annotations

TYPE_CHECKING = False    # (typing's, without importing typing: a hot command imports this module)
if TYPE_CHECKING:
    from typing import Any

NO, REQUIRED, OPTIONAL = 0, 1, 2
SLURM_VERSION = "22.05.9"          # the release whose commands these are
VERSION_LINE = f"slurm {SLURM_VERSION}"   # what ``-V``/``--version`` prints, as Slurm's commands do


class OptionError(Exception):
    """A bad command line, worded as getopt words it (the caller adds 'Try "prog --help"...')."""


class Option:
    """One option: its short letter, long names, whether it takes a value, and where it goes."""

    __slots__ = ("short", "longs", "arg", "dest", "append")

    def __init__(self, short: str | None, longs: str, arg: int, dest: str, append: bool = False) -> None:
        self.short = short
        self.longs = tuple(longs.split()) if longs else ()
        self.arg = arg
        self.dest = dest
        self.append = append


def table(*rows: tuple) -> list[Option]:
    """An option table from rows ``(short letter or "", "long names", NO|REQUIRED|OPTIONAL, dest[, append])``."""
    return [Option(short or None, longs, arg, dest, *more) for short, longs, arg, dest, *more in rows]


def read_command_line(prog: str, argv: list[str], table: list[Option]) -> "tuple[dict[str, Any], list[str]] | int":
    """A query command's options and operands; or the exit status when the command line already settled it
    (a bad one, said on stderr as Slurm says it; ``--help``; ``--version``)."""
    import sys

    try:
        o, operands = parse(prog, argv, table)
    except OptionError as exc:
        print(f"{exc}\nTry \"{prog} --help\" for more information", file=sys.stderr)
        return 1
    from .helptext import answered

    if answered(prog, o, table, sys.stdout):
        return 0
    return o, operands


def parse(prog: str, argv: list[str], table: list[Option], *, stop_at_operand: bool = False
          ) -> tuple[dict[str, Any], list[str]]:
    """Read ``argv`` against ``table``: ({dest: value}, operands).

    Flags give ``True``; appending options give a list of values. ``stop_at_operand`` is getopt's
    ``+`` mode (sbatch: everything after the script name belongs to the script).
    """
    return _Reader(prog, argv, table).read(stop_at_operand)


class _Reader:
    """One pass over a command line."""

    def __init__(self, prog: str, argv: list[str], table: list[Option]) -> None:
        self.prog, self.argv = prog, argv
        self.longs: dict[str, Option] = {}
        self.shorts: dict[str, Option] = {}
        for opt in table:
            for name in opt.longs:
                self.longs[name] = opt
            if opt.short:
                self.shorts[opt.short] = opt
        self.values: dict[str, Any] = {}
        self.i = 0                  # the next word of argv

    def read(self, stop_at_operand: bool) -> tuple[dict[str, Any], list[str]]:
        argv = self.argv
        operands: list[str] = []
        while self.i < len(argv):
            arg = argv[self.i]
            self.i += 1
            if arg == "--":
                operands += argv[self.i:]
                break
            if arg.startswith("--"):
                self._long(arg)
            elif arg.startswith("-") and arg != "-":
                self._shorts(arg)
            else:
                operands.append(arg)
                if stop_at_operand:
                    operands += argv[self.i:]
                    break
        return self.values, operands

    def _long(self, arg: str) -> None:
        """``--name``, ``--name=value``, ``--name value``, or a unique prefix of a name."""
        prog, longs = self.prog, self.longs
        name, eq, value = arg[2:].partition("=")
        opt = longs.get(name)
        if opt is None:
            matches = [n for n in longs if n.startswith(name)]
            if not matches:
                raise OptionError(f"{prog}: unrecognized option '{arg}'")
            if len({id(longs[n]) for n in matches}) > 1:
                raise OptionError(f"{prog}: option '{arg}' is ambiguous; possibilities:"
                                  + "".join(f" '--{n}'" for n in matches))
            name, opt = matches[0], longs[matches[0]]
        if opt.arg == NO and eq:
            raise OptionError(f"{prog}: option '--{name}' doesn't allow an argument")
        self._take(opt, value if eq else None, f"{prog}: option '--{name}' requires an argument")

    def _shorts(self, arg: str) -> None:
        """``-x``, bundled flags ``-Hv``, ``-pvalue`` and ``-p value``."""
        j = 1
        while j < len(arg):
            letter = arg[j]
            j += 1
            opt = self.shorts.get(letter)
            if opt is None:
                raise OptionError(f"{self.prog}: invalid option -- '{letter}'")
            if opt.arg == NO:
                self._store(opt, True)
                continue
            self._take(opt, arg[j:] or None, f"{self.prog}: option requires an argument -- '{letter}'")
            return

    def _store(self, opt: Option, value: object) -> None:
        if opt.append:
            self.values.setdefault(opt.dest, []).append(value)
        else:
            self.values[opt.dest] = value

    def _take(self, opt: Option, attached: str | None, missing: str) -> None:
        """Store ``opt``'s value: attached, else the next word when it requires one."""
        if opt.arg == NO:
            self._store(opt, True)
        elif attached is not None:
            self._store(opt, attached)
        elif opt.arg == OPTIONAL:
            self._store(opt, True)
        elif self.i < len(self.argv):
            self._store(opt, self.argv[self.i])
            self.i += 1
        else:
            raise OptionError(missing)


def unsupported(prog: str, values: dict[str, Any]) -> list[str]:
    """rota's one convention for Slurm options it does not implement, marked in an option table's dest:
    ``~name`` changes neither what runs nor what is shown, so it is ignored with a warning (returned);
    ``!name`` would, so it is refused (OptionError, naming it). Never silently dropped."""
    for key in sorted(values):
        if key.startswith("!"):
            raise OptionError(f"{prog}: error: --{key[1:]} is not supported by rota")
    return [f"{prog}: warning: --{key[1:]} is ignored by rota" for key in sorted(values) if key.startswith("~")]


def defined_options(prog: str, values: dict[str, Any], table: list[Option]) -> list[str]:
    """``-v``'s list of the options given, as Slurm's commands print it (a flag is ``set``; ``-v``, its count)."""
    lines = [f"{prog}: defined options", f"{prog}: {'-' * 20} {'-' * 20}"]
    for opt in sorted(table, key=lambda o: o.longs[0] if o.longs else ""):
        value = values.get(opt.dest)
        if value is None or not opt.longs:
            continue
        if isinstance(value, list):
            value = len(value) if all(v is True for v in value) else ",".join(map(str, value))
        lines.append(f"{prog}: {opt.longs[0]:<20}: {'set' if value is True else value}")
    return lines + [f"{prog}: {'-' * 20} {'-' * 20}", f"{prog}: end of defined options"]


def node_count(prog: str, text: str) -> int:
    """The minimum of ``-N MIN[-MAX]``; OptionError in Slurm's words when it is no node count, or MAX < MIN."""
    low, dash, high = text.partition("-")
    if not low.isdecimal() or (dash and not high.isdecimal()):
        raise OptionError(f"{prog}: error: \"{text}\" is not a valid node count\n"
                          f"{prog}: error: invalid node count `{text}'")
    if dash and int(high) < int(low):
        raise OptionError(f"{prog}: error: Maximum node count {int(high)} is less than minimum node count {int(low)}\n"
                          f"{prog}: error: invalid node count `{text}'")
    return int(low)
