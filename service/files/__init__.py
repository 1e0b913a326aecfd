"""Uploaded dataset files: `POST /files` (streamed to disk), listing, reading, deleting."""
