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


def parse(prog: str, argv: list[str], table: list[Option], *, stop_at_operand: bool = False
          ) -> tuple[dict[str, Any], list[str]]:
    """Read ``argv`` against ``table``: ({dest: value}, operands).

    Flags give ``True``; appending options give a list of values. ``stop_at_operand`` is getopt's
    ``+`` mode (sbatch: everything after the script name belongs to the script).
    """
    longs: dict[str, Option] = {}
    shorts: dict[str, Option] = {}
    for opt in table:
        for name in opt.longs:
            longs[name] = opt
        if opt.short:
            shorts[opt.short] = opt
    values: dict[str, Any] = {}
    operands: list[str] = []

    def store(opt: Option, value: object) -> None:
        if opt.append:
            values.setdefault(opt.dest, []).append(value)
        else:
            values[opt.dest] = value

    def take(opt: Option, attached: str | None, i: int, missing: str) -> int:
        """Store ``opt``'s value (attached, else the next word when required); the next index."""
        if opt.arg == NO:
            store(opt, True)
        elif attached is not None:
            store(opt, attached)
        elif opt.arg == OPTIONAL:
            store(opt, True)
        elif i < len(argv):
            store(opt, argv[i])
            return i + 1
        else:
            raise OptionError(missing)
        return i

    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            operands += argv[i:]
            break
        if arg.startswith("--"):
            body = arg[2:]
            name, eq, value = body.partition("=")
            found = longs.get(name)
            if found is None:
                matches = [n for n in longs if n.startswith(name)]
                if not matches:
                    raise OptionError(f"{prog}: unrecognized option '{arg}'")
                if len({id(longs[n]) for n in matches}) > 1:
                    raise OptionError(f"{prog}: option '{arg}' is ambiguous; possibilities:"
                                      + "".join(f" '--{n}'" for n in matches))
                name, found = matches[0], longs[matches[0]]
            opt = found
            if opt.arg == NO and eq:
                raise OptionError(f"{prog}: option '--{name}' doesn't allow an argument")
            i = take(opt, value if eq else None, i, f"{prog}: option '--{name}' requires an argument")
            continue
        if arg.startswith("-") and arg != "-":
            j = 1
            while j < len(arg):
                letter = arg[j]
                j += 1
                short = shorts.get(letter)
                if short is None:
                    raise OptionError(f"{prog}: invalid option -- '{letter}'")
                opt = short
                if opt.arg == NO:
                    store(opt, True)
                    continue
                i = take(opt, arg[j:] or None, i, f"{prog}: option requires an argument -- '{letter}'")
                break
            continue
        operands.append(arg)
        if stop_at_operand:
            operands += argv[i:]
            break
    return values, operands


def unsupported(prog: str, values: dict[str, Any]) -> list[str]:
    """rota's one convention for Slurm options it does not implement, marked in an option table's dest:
    ``~name`` changes neither what runs nor what is shown, so it is ignored with a warning (returned);
    ``!name`` would, so it is refused (OptionError, naming it). Never silently dropped."""
    for key in sorted(values):
        if key.startswith("!"):
            raise OptionError(f"{prog}: error: --{key[1:]} is not supported by rota")
    return [f"{prog}: warning: --{key[1:]} is ignored by rota" for key in sorted(values) if key.startswith("~")]
