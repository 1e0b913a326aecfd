"""`python -m trainer` / `accelerate launch -m trainer`: parse (instant), then train (heavy imports)."""

from __future__ import annotations

import logging
import os
import sys

from .args import parse_args


def cli() -> None:
    args = parse_args()
    from .train import main

    main(args)
    # Everything is saved and every rank has left the process group: skip interpreter teardown.
    # Left to it, C++ threads that torch, gloo or tokenizers still hold are destroyed in arbitrary
    # order, and one of them can abort ("terminate called without an active exception", SIGABRT)
    # after the run has finished, which turned a finished run into a failed one (seen in CI on SLURM).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    cli()
