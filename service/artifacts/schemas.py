"""The artifacts API's models: the contract's models live in the core (`ftq.contract.schemas`), shared with
the
client SDK; this module names them for the routes."""

from __future__ import annotations

from ftq.contract.schemas import Artifact, ArtifactKind, ArtifactList, ErrorBody

__all__ = ["Artifact", "ArtifactKind", "ArtifactList", "ErrorBody"]
