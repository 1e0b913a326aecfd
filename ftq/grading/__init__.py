"""Scoring graders (ftq.contract.graders): pure functions for every type but `python`, whose source runs
in the tenant-code sandbox (ftq.grading.sandbox on ftq.sandbox: bubblewrap). The trainer, the service and
the worker all import this package; of ftq it imports only the contract and the sandbox (import-linter
rules in pyproject.toml), and of the rest the standard library and rapidfuzz, so the trainer, which may
use nothing else of the core, can score rewards with the same code the service's `POST /graders/run`
does."""
