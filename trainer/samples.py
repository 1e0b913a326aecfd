"""samples.jsonl: greedy completions of the spec's `eval.sample_prompts`, while the model trains.

When: at every evaluation when the run has an eval split; without one, every `training.eval_steps` steps
(or, unset, at every checkpoint's `save_steps`); and once at the end, unless the last step was sampled
already. Each time writes one line per prompt, `{"step", "index", "prompt", "completion", "time"}`, from
the main process, flushed at once so that the worker's ingest can tail the file.

Who generates: where the weights are sharded (FSDP 1 or 2, DeepSpeed ZeRO-3) no rank holds the model,
so every rank runs the same greedy loop on the same prompts, all of them in one left-padded batch with the
KV cache: one forward of the prepared (wrapped) model for the prompts, then one per new token, each the
very forward `trainer.evaluate()` runs, so each rank gathers and frees its shards exactly as evaluation
does. The ranks stay in step because each runs the same number of forwards (no rank stops early at EOS
on its own; each completion is cut at EOS afterwards): 8 prompts of 64 tokens are 64 gathers of the
weights, where a forward of the whole sequence per prompt and token was 512. Elsewhere (one process, DDP,
ZeRO-1/2) the main process alone runs the same batched loop on the unwrapped model; the other ranks wait
for it at their next collective.

A chat model trained on `messages` sees each prompt as one user turn through its chat template (with the
generation prompt), as at inference; a text model sees the prompt as training encoded text (with BOS).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("trainer")


def samples_callback(
    path: Path,
    prompts: list[str],
    max_new_tokens: int,
    *,
    tokenizer: Any,
    chat: bool,
    every_steps: int | None,
) -> Any:
    """A TrainerCallback writing `path`; built here so that importing this module stays light.

    every_steps: sample on the step cadence (a run without eval split); None: sample at each evaluation.
    Call `.attach(trainer)` once the trainer exists and `.final()` after training.
    """
    from transformers import TrainerCallback

    class SamplesJsonlCallback(SampleWriter, TrainerCallback):
        pass

    return SamplesJsonlCallback(
        path, prompts, max_new_tokens, tokenizer=tokenizer, chat=chat, every_steps=every_steps
    )


class SampleWriter:
    """The callback's logic: generation on every rank that must take part, the write on the main one."""

    def __init__(
        self,
        path: Path,
        prompts: list[str],
        max_new_tokens: int,
        *,
        tokenizer: Any,
        chat: bool,
        every_steps: int | None,
    ):
        self.path = path
        self.prompts = list(prompts)
        self.max_new_tokens = max_new_tokens
        self.tokenizer = tokenizer
        self.chat = chat
        self.every_steps = every_steps
        self.trainer: Any = None
        self.sampled_steps: set[int] = set()

    def attach(self, trainer: Any) -> None:
        self.trainer = trainer

    # TrainerCallback events: every rank gets them, at the same point of the loop.

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.every_steps is None:
            self.sample(int(state.global_step))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self.every_steps is not None and step > 0 and step % self.every_steps == 0:
            self.sample(step)

    def final(self) -> None:
        """Samples of the trained model at its last step (skipped when that step was sampled already)."""
        self.sample(int(self.trainer.state.global_step))

    # Generation

    def sample(self, step: int) -> None:
        if not self.prompts or self.trainer is None or step in self.sampled_steps:
            return
        self.sampled_steps.add(step)
        import torch

        trainer = self.trainer
        acc = trainer.accelerator
        sharded = weights_sharded(trainer)
        if not sharded and not acc.is_main_process:
            return  # the main process alone generates; this rank meets it at the next collective
        started = time.time()
        model = trainer.model_wrapped if sharded else acc.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                completions = self._complete(model, acc.device)
        finally:
            model.train(was_training)
        if acc.is_main_process:
            now = time.time()
            with self.path.open("a", encoding="utf-8") as f:
                for index, (prompt, completion) in enumerate(zip(self.prompts, completions, strict=True)):
                    record = {"step": step, "index": index, "prompt": prompt, "completion": completion}
                    f.write(json.dumps({**record, "time": now}) + "\n")
                f.flush()
            log.info(
                "samples at step %d: %d completion(s) of up to %d tokens in %.1fs (%s)",
                step,
                len(completions),
                self.max_new_tokens,
                now - started,
                "all ranks" if sharded else "main process",
            )

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt's token ids, as the model saw such text in training."""
        tok = self.tokenizer
        if self.chat:
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            # The template alone decides BOS and the rest, as TRL tokenizes chat data.
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt)["input_ids"])

    def _complete(self, model: Any, device: Any) -> list[str]:
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        prompts = [self.prompt_ids(prompt) for prompt in self.prompts]
        new = greedy_in_step(model, prompts, self.max_new_tokens, pad=pad, device=device)
        return [decode_until_eos(self.tokenizer, tokens, eos) for tokens in new]


def greedy_in_step(
    model: Any, prompts: list[list[int]], max_new_tokens: int, *, pad: int, device: Any
) -> list[list[int]]:
    """`max_new_tokens` greedy tokens after each prompt, the prompts in one left-padded batch with the KV
    cache: one forward for the prompts, then one per new token (`max_new_tokens` forwards in all).

    Every rank of a sharded model calls this with the same prompts: each forward is a collective (the
    shards are gathered layer by layer), so every rank runs exactly as many, EOS or not. The positions
    count from each prompt's first real token, as in a batch of one, so padding changes no prompt's
    answer."""
    import torch

    if not prompts or max_new_tokens < 1:
        return [[] for _ in prompts]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    new: list[Any] = []
    for step in range(max_new_tokens):
        token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True).to(device)
        new.append(token)
        if step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(
            input_ids=token,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    tokens = torch.cat(new, dim=1).tolist()
    return [list(map(int, row)) for row in tokens]


def decode_until_eos(tokenizer: Any, new: list[int], eos: int | None) -> str:
    if eos is not None and eos in new:
        new = new[: new.index(eos)]
    return str(tokenizer.decode(new, skip_special_tokens=True))


def weights_sharded(trainer: Any) -> bool:
    """Whether no rank holds the whole model: FSDP (1 or 2), or DeepSpeed ZeRO stage 3."""
    if trainer.is_fsdp_enabled:
        return True
    if trainer.is_deepspeed_enabled:
        engine = trainer.model_wrapped
        return bool(getattr(engine, "zero_optimization_partition_weights", lambda: False)())
    return False


def every_steps(eval_steps: int | None, save_steps: int | None) -> int | None:
    """The cadence of a run without an eval split: eval_steps when set, else save_steps (None: the end
    only)."""
    return eval_steps or save_steps
