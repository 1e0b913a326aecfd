"""The files API's models: the contract's models live in the core (`ftq.contract.schemas`), shared with the
SDK."""

from __future__ import annotations

from ftq.contract.schemas import ErrorBody, FileError, FileList, FilePublic

__all__ = ["ErrorBody", "FileError", "FileList", "FilePublic"]
