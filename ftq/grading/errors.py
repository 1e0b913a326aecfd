"""The one failure of scoring: a grader that raised, hung, exceeded a limit or named what is missing."""

from __future__ import annotations

from ftq.contract.errors import ErrorCode


class GraderError(Exception):
    """`grader`: the grader's name; `limit`: the limit it exceeded (cpu, memory, wall_clock, processes),
    or None; `details`: the grader's own traceback, trimmed."""

    code = ErrorCode.grader_error

    def __init__(self, grader: str, message: str, *, limit: str | None = None, details: str = "") -> None:
        super().__init__(f"grader {grader!r}: {message}")
        self.grader = grader
        self.limit = limit
        self.details = details

    @property
    def message(self) -> str:
        text = str(self)
        return f"{text}\n{self.details}" if self.details else text
