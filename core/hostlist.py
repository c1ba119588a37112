"""Slurm hostlist expressions: ``gpu[01-16]``, ``r[1-2]n[1-3]``, ``a,b,c[1,3-5]`` (pure)."""
from __future__ import annotations


MAX_HOSTS = 65536


class HostlistError(ValueError):
    """A hostlist expression that cannot be expanded."""


def _split_top_level(expr: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        if ch in ", " and depth == 0:
            if cur:
                parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    if cur:
        parts.append("".join(cur))
    return parts


def _expand_range(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for piece in body.split(","):
        if not piece:
            raise HostlistError(f"empty range in hostlist {expr!r}")
        lo, dash, hi = piece.partition("-")
        if not lo.isdecimal() or (dash and not hi.isdecimal()):
            raise HostlistError(f"bad range {piece!r} in hostlist {expr!r}: use digits like 01-16")
        if not dash:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise HostlistError(f"range {piece!r} in hostlist {expr!r} runs backwards")
        if b - a + 1 > MAX_HOSTS:
            raise HostlistError(f"range {piece!r} in hostlist {expr!r} is larger than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(i).zfill(width) for i in range(a, b + 1))
    return out


_GROUP = None   # compiled on first use: `compress` (every squeue/sacct row) needs no regular expressions


def _groups(item: str):
    global _GROUP
    if _GROUP is None:
        import re

        _GROUP = re.compile(r"\[([^\]]*)\]")
    return _GROUP.finditer(item)


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression into host names, in order, duplicates kept out."""
    hosts: list[str] = []
    seen: set[str] = set()
    for item in _split_top_level(expr.strip()):
        names = [""]
        pos = 0
        for m in _groups(item):
            prefix = item[pos:m.start()]
            choices = _expand_range(m.group(1), expr)
            names = [n + prefix + c for n in names for c in choices]
            if len(names) > MAX_HOSTS:
                raise HostlistError(f"hostlist {expr!r} names more than {MAX_HOSTS} hosts")
            pos = m.end()
        tail = item[pos:]
        if "[" in tail or "]" in tail:
            raise HostlistError(f"unbalanced brackets in hostlist {expr!r}")
        for n in names:
            name = n + tail
            if name not in seen:
                seen.add(name)
                hosts.append(name)
    return hosts


def _number_suffix(host: str) -> tuple[str, str] | None:
    """``gpu012`` -> ("gpu", "012"); None when the name does not end in digits."""
    stem = host.rstrip("0123456789")
    return None if len(stem) == len(host) else (stem, host[len(stem):])


def compress(hosts: list[str] | tuple[str, ...]) -> str:
    """Compress host names into a hostlist expression, keeping the given order of prefixes."""
    groups: dict[str, list[tuple[int, str]]] = {}
    order: list[str] = []
    plain: list[str] = []
    for h in hosts:
        m = _number_suffix(h)
        if not m:
            key = "\0" + h
            if key not in groups:
                groups[key] = []
                order.append(key)
            continue
        prefix, digits = m
        if prefix not in groups:
            groups[prefix] = []
            order.append(prefix)
        groups[prefix].append((int(digits), digits))
    out: list[str] = []
    for key in order:
        if key.startswith("\0"):
            out.append(key[1:])
            continue
        items = sorted(set(groups[key]))
        if len(items) == 1:
            out.append(key + items[0][1])
            continue
        ranges: list[str] = []
        start = prev = items[0]
        for it in items[1:]:
            if it[0] == prev[0] + 1 and len(it[1]) == len(prev[1]):
                prev = it
                continue
            ranges.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
            start = prev = it
        ranges.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
        out.append(f"{key}[{','.join(ranges)}]")
    out.extend(plain)
    return ",".join(out)
