"""Reading the captured real-Slurm outputs in tests/fixtures/slurm-golden and comparing layouts."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "slurm-golden"


@dataclass
class Block:
    command: str          # without the "$ " / "# " prompt
    as_root: bool
    output: list[str]
    exit: int
    scripts: dict[str, str] = field(default_factory=dict)   # "## script NAME:" files the command reads


def blocks(name: str) -> list[Block]:
    """The command blocks of one golden file."""
    out: list[Block] = []
    cur: Block | None = None
    scripts: dict[str, list[str]] = {}
    script: list[str] | None = None
    for line in (GOLDEN / name).read_text().splitlines():
        if cur is None:
            if line.startswith("## script ") and line.endswith(":"):
                script = scripts.setdefault(line[len("## script "):-1], [])
            elif line.startswith("##   ") and script is not None:
                script.append(line[len("##   "):])
            elif line.startswith(("$ ", "# ")):
                cur = Block(line[2:], line.startswith("# "), [], 0,
                            {n: "\n".join(body) + "\n" for n, body in scripts.items()})
                scripts, script = {}, None
            continue
        m = re.fullmatch(r"\[exit=(\d+)\]", line)
        if m:
            cur.exit = int(m.group(1))
            out.append(cur)
            cur = None
        else:
            cur.output.append(line)
    return out


def columns(dashes: str) -> list[tuple[int, int]]:
    """Column spans from a header's dashes row (``---- ----- ``)."""
    return [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]


def cells(line: str, spans: list[tuple[int, int]]) -> list[str]:
    return [line[a:b] for a, b in spans]


def assert_same_table(ours: list[str], golden: list[str], loose: set[int] = frozenset()) -> None:
    """Same header, dashes, row count and every cell (padding included); columns in ``loose``
    (timings, memory) must only agree on alignment and on being empty or not."""
    assert ours[:2] == golden[:2], f"header differs:\n{ours[:2]}\n{golden[:2]}"
    assert len(ours) == len(golden), "\n".join(["rows differ:", *ours, "--- golden:", *golden])
    spans = columns(golden[1])
    for o, g in zip(ours[2:], golden[2:]):
        assert len(o) == len(g), f"line width differs:\n{o!r}\n{g!r}"
        for i, (oc, gc) in enumerate(zip(cells(o, spans), cells(g, spans))):
            if i in loose:
                assert bool(oc.strip()) == bool(gc.strip()), f"column {i}: {oc!r} vs {gc!r}"
                assert (oc.strip() == "" or oc.endswith(oc.strip()[-1])) == (gc.strip() == "" or gc.endswith(gc.strip()[-1]))
            else:
                assert oc == gc, f"column {i}: {oc!r} vs {gc!r}\n{o}\n{g}"
