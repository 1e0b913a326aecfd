"""Evaluations of a job's checkpoints with its spec's suites, run as launches of their own."""
