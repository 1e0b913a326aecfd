"""The exports API's request and response models: the contract's models live in the core
(`ftq.contract.schemas`),
shared with the client SDK."""

from __future__ import annotations

from ftq.contract.schemas import ExportCreate, ExportDtype, ExportKind, ExportList, ExportPublic, PushToHub

__all__ = ["ExportCreate", "ExportDtype", "ExportKind", "ExportList", "ExportPublic", "PushToHub"]
