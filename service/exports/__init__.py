"""Exports of a succeeded job's final/: merged weights or the adapter, run as launches of their own."""
