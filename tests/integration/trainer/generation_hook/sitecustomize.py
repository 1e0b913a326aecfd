"""Loaded by a trainer process whose PYTHONPATH starts with this folder (test_grpo_lockstep.py), when
FTQ_TEST_GENERATION_LOG names a file prefix: every `generate()` call appends one JSON line to
`<prefix>.rank<RANK>` with the forwards this rank ran in it, the forward after which its own completions
had all ended (None: they never all ended early), whether transformers kept the ranks in step
(`synced_gpus`), the prompts' (padded) width and the tokens it returned. FTQ_TEST_UNSYNCED=1 passes
`synced_gpus=False`, which is what a rank that does not know its weights are sharded does (measured:
gloo aborts at the first uneven step, "Received data size doesn't match expected size")."""

from __future__ import annotations

import builtins
import json
import os
from typing import Any

_PREFIX = os.environ.get("FTQ_TEST_GENERATION_LOG")


def _patch() -> None:
    from transformers.generation import utils

    generate, unfinished = utils.GenerationMixin.generate, utils.GenerationMixin._has_unfinished_sequences

    def counted_generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.environ.get("FTQ_TEST_UNSYNCED"):
            kwargs["synced_gpus"] = False
        record: dict[str, Any] = {"forwards": 0, "own_end": None, "synced": None, "checks": 0}
        prompts = kwargs.get("input_ids", args[0] if args else None)
        record["prompt_width"] = int(prompts.shape[1]) if prompts is not None else 0

        def count(*_: Any) -> None:
            record["forwards"] += 1

        hook = self.register_forward_hook(count)
        self._ftq_generation = record
        try:
            out = generate(self, *args, **kwargs)
        finally:
            hook.remove()
            self._ftq_generation = None
        with open(f"{_PREFIX}.rank{os.environ.get('RANK', '0')}", "a") as f:
            f.write(json.dumps({**record, "tokens": out.tolist()}) + "\n")
        return out

    def checked(self: Any, this_peer_finished: bool, synced_gpus: bool, device: Any) -> bool:
        record = getattr(self, "_ftq_generation", None)
        if record is not None:
            record["synced"] = bool(synced_gpus)
            if this_peer_finished and record["own_end"] is None:
                record["own_end"] = record["checks"]
            record["checks"] += 1
        return bool(unfinished(self, this_peer_finished, synced_gpus, device))

    utils.GenerationMixin.generate = counted_generate  # type: ignore[method-assign]
    utils.GenerationMixin._has_unfinished_sequences = checked  # type: ignore[method-assign]


if _PREFIX:
    _import = builtins.__import__

    def _import_then_patch(name: str, *args: Any, **kwargs: Any) -> Any:
        module = _import(name, *args, **kwargs)
        if name == "trl" or name.startswith("trl."):
            # TRL imports transformers' generation first: patch once, before any trainer exists.
            builtins.__import__ = _import
            _patch()
        return module

    builtins.__import__ = _import_then_patch
