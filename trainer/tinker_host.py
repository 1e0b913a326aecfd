"""`python -m trainer.tinker_host <folder>`: a Tinker training client's resident process (issue 52).

It loads the catalog base the API resolved (`host.json`: float32, on the CPU or its one GPU) with a PEFT
LoRA (the rank, the modules `train_attn`/`train_mlp`/`train_unembed` select, the seed), keeps it in memory
between calls, and answers a small JSON RPC over HTTP on a free port (`endpoint.json` says where). Only
the API calls it: every call carries the host's own key (`host.key`), anything else is a 401. One thread
serves it, so calls run one at a time in the order the API sends them (the API orders them by seq_id).

Operations (`ftq.contract.tinker.OPS`), each `POST /<op>`:
- `forward_backward`: per datum `tokens` and `loss_fn_inputs` (`{name: {"data": [...], "shape": [...]}}`),
  `loss_fn` (cross_entropy, importance_sampling, ppo), `loss_fn_config`, `forward_only`. Gradients add up
  until `optim_step`, as in Tinker. Answers each datum's `logprobs` (of target_tokens) and
  `elementwise_loss`, and metrics named `<name>:<reduction>` (the SDK combines chunks by that suffix).
- `optim_step`: AdamW with the call's learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm.
- `save_state` / `load_state`: the adapter (and the optimizer's state when asked) in a folder the API
  chose; `save_sampler`: the adapter with the tokenizer (a PEFT folder that `from_pretrained` and vLLM
  load).
- `sample`: `num_samples` continuations of `prompt` with their logprobs (the model's own log-softmax, the
  same numbers forward_backward gives for those tokens: importance ratios start at 1), and, when asked,
  the prompt's logprobs (NaN at position 0); on the resident adapter, on saved sampler weights
  (`adapter`), or on the base alone (`base_only`).

Losses are sums over tokens and datums, Tinker's convention (no mean): the caller's weights normalize.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import torch

from ftq.contract.runs import write_endpoint
from ftq.contract.tinker import GRADS_FILE, KEY, KEY_HEADER, LOSS_FNS, OPS, REQUEST

log = logging.getLogger("ftq.tinker_host")

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "query_key_value", "c_attn", "qkv_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj", "dense_h_to_4h", "dense_4h_to_h", "c_fc", "gate_up_proj")
UNEMBED_MODULES = ("lm_head",)
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "tinker_state.json"


class UserError(Exception):
    """A call the host refuses for what the caller sent (a 400 the SDK shows)."""


# Losses (pure: the unit tests check them against hand computation) -------------------------------------


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[i] | prefix up to i) from logits [N, V] (float32)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def datum_loss(
    loss_fn: str, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]
) -> torch.Tensor:
    """The elementwise loss [N] of one datum (its sum is what is minimized)."""
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        if weights is None:
            weights = torch.ones_like(logprobs)
        return -(weights.to(logprobs.dtype) * logprobs)
    if loss_fn in ("importance_sampling", "ppo"):
        for name in ("logprobs", "advantages"):
            if name not in inputs:
                raise UserError(f"loss_fn {loss_fn} needs loss_fn_inputs {name!r}")
        ratio = torch.exp(logprobs - inputs["logprobs"].to(logprobs.dtype))
        advantages = inputs["advantages"].to(logprobs.dtype)
        if loss_fn == "importance_sampling":
            return -(ratio * advantages)
        low = float(config.get("clip_low_threshold", 0.8))
        high = float(config.get("clip_high_threshold", 1.2))
        clipped = torch.clamp(ratio, low, high)
        return -torch.minimum(ratio * advantages, clipped * advantages)
    raise UserError(f"loss_fn {loss_fn!r} is not supported by this server (supported: {', '.join(LOSS_FNS)})")


# The resident model ----------------------------------------------------------------------------------------


def lora_targets(model: torch.nn.Module, attn: bool, mlp: bool, unembed: bool) -> list[str]:
    """The Linear modules' names the LoRA goes on, by what the caller trains."""
    wanted: set[str] = set()
    if attn:
        wanted.update(ATTN_MODULES)
    if mlp:
        wanted.update(MLP_MODULES)
    if unembed:
        wanted.update(UNEMBED_MODULES)
    present = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    found = sorted(wanted & present)
    if not found:
        raise UserError("the LoRA targets no module of this model: train_attn, train_mlp or train_unembed")
    return found


class Host:
    def __init__(self, config: dict[str, Any], device: str = "cpu"):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device("cuda" if device == "cuda" and torch.cuda.is_available() else "cpu")
        self.config = config
        base = config["base_folder"]
        lora = config["lora"]
        self.tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        seed = lora.get("seed")
        if seed is not None:
            torch.manual_seed(int(seed))
        targets = lora_targets(
            model, bool(lora.get("train_attn", True)), bool(lora.get("train_mlp", True)),
            bool(lora.get("train_unembed", True)),
        )  # fmt: skip
        rank = int(lora["rank"])
        peft_config = LoraConfig(
            r=rank, lora_alpha=int(lora.get("alpha") or 32), lora_dropout=0.0, target_modules=targets
        )
        self.model = get_peft_model(model, peft_config).to(self.device)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: torch.optim.AdamW | None = None
        self.steps = 0
        load = config.get("load")
        if load:
            flags = {k: bool(load.get(k)) for k in ("optimizer", "grads")}
            self.load_state({"folder": load["folder"], **flags})
            self.steps = int(load.get("steps") or _saved_steps(Path(load["folder"])))

    # forward_backward --------------------------------------------------------------------------------

    def forward_backward(self, body: dict[str, Any]) -> dict[str, Any]:
        loss_fn = str(body.get("loss_fn") or "cross_entropy")
        if loss_fn not in LOSS_FNS:
            raise UserError(
                f"loss_fn {loss_fn!r} is not supported by this server (supported: {', '.join(LOSS_FNS)})"
            )
        config = {k: float(v) for k, v in (body.get("loss_fn_config") or {}).items()}
        forward_only = bool(body.get("forward_only"))
        data = body.get("data") or []
        if not data:
            raise UserError("forward_backward needs at least one datum")
        seqs = [torch.tensor(d["tokens"], dtype=torch.long) for d in data]
        if any(len(s) == 0 for s in seqs):
            raise UserError("a datum has an empty model_input")
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.set_grad_enabled(not forward_only):
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            total = torch.zeros((), device=self.device)
            outputs = []
            for i, (d, s) in enumerate(zip(data, seqs, strict=True)):
                n = len(s)
                inputs = {
                    k: _tensor(v, n).to(self.device) for k, v in (d.get("loss_fn_inputs") or {}).items()
                }
                if "target_tokens" not in inputs:
                    raise UserError("every datum needs loss_fn_inputs 'target_tokens'")
                lp = target_logprobs(logits[i, :n], inputs["target_tokens"])
                elementwise = datum_loss(loss_fn, lp, inputs, config)
                total = total + elementwise.sum()
                outputs.append(
                    {
                        "logprobs": lp.detach().cpu().tolist(),
                        "elementwise_loss": elementwise.detach().cpu().tolist(),
                    }
                )
        if not forward_only:
            total.backward()
        return {"loss_fn_outputs": outputs, "metrics": {"loss:sum": float(total.detach())}}

    # optim_step ----------------------------------------------------------------------------------------

    def _optimizer(self) -> torch.optim.AdamW:
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(
                self.params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
            )
        return self.optimizer

    def optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        p = body.get("adam_params") or {}
        optimizer = self._optimizer()
        for group in optimizer.param_groups:
            group["lr"] = float(p.get("learning_rate", 1e-4))
            group["betas"] = (float(p.get("beta1", 0.9)), float(p.get("beta2", 0.95)))
            group["eps"] = float(p.get("eps", 1e-12))
            group["weight_decay"] = float(p.get("weight_decay", 0.0))
        clip = float(p.get("grad_clip_norm", 0.0) or 0.0)
        grads = [q.grad for q in self.params if q.grad is not None]
        norm = (
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            if grads
            else 0.0
        )
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {
            "metrics": {"grad_norm:mean": norm, "learning_rate:mean": float(p.get("learning_rate", 1e-4))}
        }

    # state ---------------------------------------------------------------------------------------------

    def save_state(self, body: dict[str, Any]) -> dict[str, Any]:
        folder = Path(body["folder"])
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder), save_embedding_layers=False)
        if body.get("optimizer", True):
            torch.save(self._optimizer().state_dict(), folder / OPTIMIZER_FILE)
        (folder / GRADS_FILE).unlink(missing_ok=True)
        if body.get("grads"):  # an idle save: the gradients no optim_step has used yet go with it
            grads = {n: p.grad for n, p in self.model.named_parameters() if p.grad is not None}
            if grads:
                torch.save(grads, folder / GRADS_FILE)
        meta = {"lora": self.config["lora"], "base": self.config.get("base"), "steps": self.steps}
        (folder / META_FILE).write_text(json.dumps(meta))
        return {"size_bytes": _size(folder)}

    def load_state(self, body: dict[str, Any]) -> dict[str, Any]:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(body["folder"])
        weights = folder / "adapter_model.safetensors"
        if not weights.is_file():
            raise UserError("the state holds no adapter weights")
        set_peft_model_state_dict(self.model, load_file(str(weights), device=str(self.device)))
        if body.get("optimizer"):
            saved = folder / OPTIMIZER_FILE
            if not saved.is_file():
                raise UserError("the state was saved without its optimizer")
            self._optimizer().load_state_dict(torch.load(saved, map_location=self.device, weights_only=True))
        if body.get("grads") and (folder / GRADS_FILE).is_file():
            grads = torch.load(folder / GRADS_FILE, map_location=self.device, weights_only=True)
            for name, p in self.model.named_parameters():
                if name in grads:
                    p.grad = grads[name]
        return {}

    def save_sampler(self, body: dict[str, Any]) -> dict[str, Any]:
        folder = Path(body["folder"])
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder), save_embedding_layers=False)
        self.tokenizer.save_pretrained(str(folder))
        return {"size_bytes": _size(folder)}

    # sampling ------------------------------------------------------------------------------------------

    def sample(self, body: dict[str, Any]) -> dict[str, Any]:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict
        from safetensors.torch import load_file

        adapter = body.get("adapter")
        base_only = bool(body.get("base_only"))
        saved = None
        if adapter:
            # Saved sampler weights: swapped in for this call, the resident adapter back after it.
            saved = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
            set_peft_model_state_dict(
                self.model,
                load_file(str(Path(adapter) / "adapter_model.safetensors"), device=str(self.device)),
            )
        self.model.eval()
        try:
            if base_only:
                with self.model.disable_adapter():
                    return self._sample(body)
            return self._sample(body)
        finally:
            self.model.train()
            if saved is not None:
                set_peft_model_state_dict(self.model, saved)

    @torch.no_grad()
    def _sample(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = [int(t) for t in body["prompt"]]
        if not prompt:
            raise UserError("the prompt is empty")
        n = int(body.get("num_samples") or 1)
        params = body.get("sampling_params") or {}
        max_tokens = int(params.get("max_tokens") or 16)
        temperature = float(params.get("temperature", 1.0))
        top_k = int(params.get("top_k", -1))
        top_p = float(params.get("top_p", 1.0))
        stop = params.get("stop")
        stop_ids, stop_strings = _stops(stop, self.tokenizer.eos_token_id)
        generator = torch.Generator(device=self.device)
        if params.get("seed") is not None:
            generator.manual_seed(int(params["seed"]))
        else:
            generator.seed()
        ids = torch.tensor([prompt] * n, dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True)
        prompt_logprobs = None
        if body.get("prompt_logprobs"):
            lp = target_logprobs(out.logits[0, :-1], ids[0, 1:])
            prompt_logprobs = [math.nan, *lp.cpu().tolist()]
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        done = [False] * n
        reasons = ["length"] * n
        for _ in range(max_tokens):
            lp = torch.log_softmax(logits.float(), dim=-1)
            picked = _pick(logits.float(), temperature, top_k, top_p, generator)
            for i in range(n):
                if done[i]:
                    continue
                t = int(picked[i])
                tokens[i].append(t)
                logprobs[i].append(float(lp[i, t]))
                if t in stop_ids or (stop_strings and _has_stop(self._decode(tokens[i]), stop_strings)):
                    done[i], reasons[i] = True, "stop"
            if all(done):
                break
            out = self.model(input_ids=picked.view(n, 1), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
        return {
            "sequences": [
                {"tokens": tokens[i], "logprobs": logprobs[i], "stop_reason": reasons[i]} for i in range(n)
            ],
            "prompt_logprobs": prompt_logprobs,
        }

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens))

    def info(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"steps": self.steps, "trainable_parameters": sum(p.numel() for p in self.params)}


def _tensor(value: dict[str, Any], n: int) -> torch.Tensor:
    dtype = torch.long if value.get("dtype") == "int64" else torch.float32
    t = torch.tensor(value["data"], dtype=dtype)
    shape = value.get("shape")
    if shape:
        t = t.reshape(shape)
    if t.shape[0] != n:
        raise UserError(f"a loss_fn_input has {t.shape[0]} entries where the model_input has {n} tokens")
    return t


def _stops(stop: Any, eos: int | None) -> tuple[set[int], list[str]]:
    """Stop token ids and strings: None keeps the EOS token's stop; [] stops at nothing."""
    if stop is None:
        return ({eos} if eos is not None else set()), []
    if isinstance(stop, str):
        stop = [stop]
    ids = {int(s) for s in stop if isinstance(s, int)}
    strings: list[str] = [s for s in stop if isinstance(s, str) and s]
    return ids, strings


def _has_stop(text: str, stops: list[str]) -> bool:
    return any(s in text for s in stops)


def _pick(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator
) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) > top_p
        sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
        logits = torch.full_like(logits, -math.inf).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _saved_steps(folder: Path) -> int:
    try:
        return int(json.loads((folder / META_FILE).read_text()).get("steps") or 0)
    except (OSError, ValueError, AttributeError):
        return 0


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# HTTP ------------------------------------------------------------------------------------------------------


def make_handler(host: Host, key: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None  # each call's line is written below, with its time

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, allow_nan=True).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, {"status": "ok"})
            else:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            if not hmac.compare_digest(self.headers.get(KEY_HEADER, ""), key):
                self._answer(401, {"error": "this host answers its API only"})
                return
            op = self.path.strip("/")
            fn = getattr(host, op, None) if op in _OPS else None
            if fn is None:
                self._answer(404, {"error": f"no operation {op!r}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            started = time.monotonic()
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                result = fn(body)
            except UserError as exc:
                print(f"tinker_host: {op} refused: {exc}", flush=True)
                self._answer(400, {"error": str(exc), "category": "user"})
                return
            except Exception as exc:
                log.exception("%s failed", op)
                self._answer(
                    500, {"error": f"{op} failed: {type(exc).__name__}: {exc}", "category": "server"}
                )
                return
            label = "forward" if op == "forward_backward" and body.get("forward_only") else op
            print(f"tinker_host: {label} {time.monotonic() - started:.3f} s", flush=True)
            self._answer(200, result)

    return Handler


_OPS = frozenset(OPS)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    folder = Path(argv[1]).resolve()
    request = json.loads((folder / REQUEST).read_text())
    key = (folder / KEY).read_text().strip()
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads())))
    started = time.monotonic()
    host = Host(request["config"], device=str(request.get("device") or "cpu"))
    bind = str(request.get("host") or "127.0.0.1")
    server = HTTPServer((bind, 0), make_handler(host, key))
    port = server.server_address[1]
    name = bind if bind not in ("0.0.0.0", "::") else socket.getfqdn()
    write_endpoint(folder, f"http://{name}:{port}")
    loaded = time.monotonic() - started
    print(f"tinker_host: {request.get('model_id')} on port {port}, loaded in {loaded:.1f} s", flush=True)
    server.serve_forever()  # until the launcher's SIGTERM (a cancel, or the session's end)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
