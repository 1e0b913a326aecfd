"""Scoring graders (ftq.contract.graders): pure functions for every type but `python`, whose source runs
in a sandboxed process (ftq.grading.sandbox). The trainer, the service and the worker all import this
package; it imports only the contract and the standard library (an import-linter rule in pyproject.toml),
so the trainer, which may use nothing else of the core, can score rewards with the same code the
service's `POST /graders/run` does."""
