"""`python -m trainer` / `accelerate launch -m trainer`: parse (instant), then train (heavy imports)."""

from __future__ import annotations

from .args import parse_args


def cli() -> None:
    args = parse_args()
    from .train import main

    main(args)


if __name__ == "__main__":
    cli()
