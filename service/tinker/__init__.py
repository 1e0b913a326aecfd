"""The Tinker API (issue 52): the official `tinker` SDK's protocol under `/api/v1` (see docs/tinker.md)."""
