"""Print the app's OpenAPI document (what `make openapi` commits as openapi/openapi.json)."""

from __future__ import annotations

import json
import sys


def main() -> None:
    from service.app import create_app

    json.dump(create_app().openapi(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
