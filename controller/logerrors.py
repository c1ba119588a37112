"""What a log append or read can fail with (shared by the log and its readers)."""
from __future__ import annotations


class FencedError(Exception):
    """The log moved on since the writer's last folded sequence: the writer is stale."""

    def __init__(self, expected: int, actual: int | None = None) -> None:
        super().__init__(f"append refused: log is past sequence {expected}"
                         + (f" (now at {actual})" if actual is not None else ""))
        self.expected, self.actual = expected, actual


class LogUnavailable(Exception):
    """The log did not confirm an append in time: it may or may not have stored it; retry."""


class NotSent(Exception):
    """A record of a group was not sent: the one before it did not land where it was fenced."""

    def __init__(self) -> None:
        super().__init__("not sent: the request before it in the same group did not land")
