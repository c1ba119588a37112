"""JSON for the hot commands through the C codec the standard ``json`` module itself uses.

``import json`` costs about 3 ms (its pure-Python layer compiles regular expressions); the C
scanner and encoder underneath (``_json``) load in a fraction of that. Where ``_json`` is missing
(another Python implementation) this falls back to ``json``.
"""
from __future__ import annotations

TYPE_CHECKING = False    # (typing's, without importing typing: a hot command imports this module)
if TYPE_CHECKING:
    from typing import Any

_json: Any
try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None


class _DecodeContext:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name.lower().replace("infinity", "inf"))


def loads(data: bytes | str):
    """Decode one JSON document."""
    text = data.decode() if isinstance(data, bytes) else data
    if _json is None:  # pragma: no cover
        import json

        return json.loads(text)
    try:
        value, end = _json.make_scanner(_DecodeContext())(text, 0)
    except StopIteration:
        raise ValueError("not a JSON document") from None
    if text[end:].strip():
        raise ValueError(f"extra data after JSON at {end}")
    return value


def dumps(value) -> str:
    """Encode ``value`` (dicts, lists, strings, numbers, booleans, None) compactly."""
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"))

    def default(obj):
        raise TypeError(f"cannot encode {type(obj).__name__} as JSON")

    encode = _json.make_encoder({}, default, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
    return "".join(encode(value, 0))
