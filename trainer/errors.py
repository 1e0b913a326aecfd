"""Errors a user can fix, reported as one line the worker's failure classifier can grep.

A run that fails because of its inputs (a dataset without the text field, a model folder without
weights) ends with exit status 2 and the line `ftq-error: <code>: <message>` on stderr, so the service
can tell the user what to change instead of showing a stack trace. The codes are the contract's
`error.code` values.
"""

from __future__ import annotations

import sys

from ftq.contract.errors import EXIT_USER_ERROR, ErrorCode
from ftq.contract.errors import USER_ERROR_PREFIX as PREFIX

__all__ = ["EXIT_USER_ERROR", "PREFIX", "DatasetError", "FtqError", "ModelError", "SpecError", "TrackerError"]


class FtqError(Exception):
    """A failure the user can fix by changing the spec or its inputs."""

    code: ErrorCode = ErrorCode.invalid_spec

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def line(self) -> str:
        # One physical line, whatever the message holds: the classifier reads line by line.
        flat = " ".join(self.message.split())
        return f"{PREFIX} {self.code.value}: {flat}"


class DatasetError(FtqError):
    code: ErrorCode = ErrorCode.dataset_error


class ModelError(FtqError):
    code: ErrorCode = ErrorCode.model_error


class SpecError(FtqError):
    code: ErrorCode = ErrorCode.invalid_spec


class TrackerError(FtqError):
    code: ErrorCode = ErrorCode.tracker_error


def report_and_exit(err: FtqError) -> None:
    """Print the one-line report on stderr and end the process with the user-error status."""
    print(err.line(), file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USER_ERROR)
