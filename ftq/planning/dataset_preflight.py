"""The dataset preflight: what a job's data amounts to, before it runs.

Rows, tokens per sample with the job's own tokenizer (min, median, p95, max), how many samples
`max_seq_len` truncates, total tokens, steps per epoch at the job's effective batch size, and the tokens
the whole run trains on, from which `ftq.planning.timecost` makes the plan's one time estimate.

Only `.jsonl` files are read (a local one, or an upload), and only their first `sample_rows` rows: a
larger file is extrapolated from those by its size, and says so (`sampled: true`). Only local tokenizers
are loaded (a model folder's `tokenizer.json`, with the `tokenizers` library: no torch, no network); for
a Hub model the token statistics are skipped with the reason. Blocking: the service runs it in its
preflight pool, within the request's deadline.

How a sample is counted, as the trainer tokenizes it: `text` with the tokenizer's special tokens;
`messages` rendered with the model's chat template (no tokens added); `prompt` + `completion` as one
text; a preference pair as `prompt` + the longer of `chosen` and `rejected` (OpenAI's: `input.messages` +
the longer of `preferred_output` and `non_preferred_output`).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftq.contract.plans import DatasetPreflight, TokenStats
from ftq.contract.spec import JobSpec, looks_local
from ftq.runtime.lru import LRU

# A rendered chat template or text longer than this (characters) is cut before tokenizing: a preflight
# never spends seconds on one row.
_MAX_SAMPLE_CHARS = 4_000_000

# Tokenizing the sample is nearly all of a submit's CPU (about 100 ms for examples/tiny's 2,000 rows,
# against about 15 for the rest of POST /jobs), and teams submit many jobs on one file: a sweep, a
# retry, the same upload with another learning rate. What it yields depends only on the file's bytes, the
# tokenizer's files and the fields the rows are read by, so it is kept per API process, keyed by those
# (each file by device, inode, size and modification time: an edited or replaced file is read again).
_SAMPLES_KEPT = 64
_samples: LRU[tuple[Any, ...], _Sample] = LRU(_SAMPLES_KEPT)


@dataclass(frozen=True)
class _Sample:
    """A file's first rows as the preflight reads them: how many, whether the file ended within them,
    the bytes they took and the file's size, and each row's tokens (None: not tokenized, for `why`)."""

    rows: int
    ended: bool
    read: int
    size: int
    tokenizer: str
    lengths: list[int] | None
    why: str | None = None


def _file_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _sample_key(path: Path, spec: JobSpec, sample_rows: int) -> tuple[Any, ...] | None:
    """What a sample's token counts depend on; None when a file cannot be read (nothing is kept then)."""
    folder = Path(spec.model.name_or_path)
    parts: list[Any] = [_file_key(path)]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        parts.append((name, _file_key(folder / name)))
    if parts[0] is None or parts[1][1] is None:
        return None
    ds = spec.dataset
    return (str(path), sample_rows, ds.messages_field, str(ds.format), ds.text_field, *parts)


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    k = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[min(k, len(sorted_values) - 1)]


def token_stats(lengths: list[int]) -> TokenStats:
    values = sorted(lengths)
    return TokenStats(
        min=values[0],
        median=_percentile(values, 0.5),
        p95=_percentile(values, 0.95),
        max=values[-1],
        mean=sum(values) / len(values),
    )


def read_sample(path: Path, max_rows: int) -> tuple[list[dict[str, Any]], bool, int, int]:
    """(first rows that are JSON objects, whether the file ended within them, bytes read, file size)."""
    rows: list[dict[str, Any]] = []
    read = 0
    with open(path, "rb") as f:
        size = path.stat().st_size
        while len(rows) < max_rows:
            line = f.readline(64 * 1024 * 1024)
            if not line:
                return rows, True, read, size
            read += len(line)
            try:
                row = json.loads(line.removeprefix(b"\xef\xbb\xbf"))
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        ended = not f.read(1)
        return rows, ended, read, size


class _Tokenizer:
    """A local fast tokenizer (tokenizer.json) and its chat template, without transformers or torch."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.template: Any = None
        config: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            config = json.loads((folder / "tokenizer_config.json").read_text())
        source = config.get("chat_template")
        jinja_file = folder / "chat_template.jinja"
        if not isinstance(source, str) and jinja_file.is_file():
            source = jinja_file.read_text()
        if isinstance(source, str):
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[_generation_markers()]
            )
            env.globals["raise_exception"] = _raise
            self.template = env.from_string(source)
        self.special = {
            k: (v if isinstance(v, str) else (v or {}).get("content", ""))
            for k, v in config.items()
            if k in ("bos_token", "eos_token") and v
        }

    def count(self, text: str, *, special: bool = True) -> int:
        return len(self.tok.encode(text[:_MAX_SAMPLE_CHARS], add_special_tokens=special).ids)

    def chat(self, messages: list[dict[str, Any]]) -> str | None:
        if self.template is None:
            return None
        return str(self.template.render(messages=messages, add_generation_prompt=False, **self.special))


def _generation_markers() -> Any:
    """`{% generation %}...{% endgeneration %}` (what marks assistant turns for loss_on: assistant, as
    transformers reads it) rendered as its body: the text is the same with or without the markers."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationMarkers(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body", []), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return GenerationMarkers


def _raise(message: str) -> None:
    raise ValueError(message)


def _as_text(value: Any, tok: _Tokenizer) -> tuple[str, bool] | None:
    """(text, special tokens added) for a text or messages value."""
    if isinstance(value, str):
        return value, True
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        rendered = tok.chat(value)
        if rendered is None:
            return "\n".join(str(m.get("content", "")) for m in value), True
        return rendered, False
    return None


def sample_length(row: dict[str, Any], spec: JobSpec, tok: _Tokenizer) -> int | None:
    """Tokens of one row as the trainer would feed it; None for a row of no known shape."""
    ds = spec.dataset
    if ds.messages_field in row and str(ds.format) != "text":
        got = _as_text(row[ds.messages_field], tok)
        if got is not None:
            return tok.count(got[0], special=got[1])
    if isinstance(row.get(ds.text_field), str):
        return tok.count(row[ds.text_field])
    prompt = row.get("prompt")
    answers = [row[k] for k in ("completion", "chosen", "rejected") if k in row]
    if isinstance(row.get("input"), dict):  # OpenAI's preference rows, as the trainer converts them
        prompt = row["input"].get("messages")
        answers = [row[k] for k in ("preferred_output", "non_preferred_output") if k in row]
    if prompt is not None and answers:
        best = 0
        for answer in answers:
            if isinstance(prompt, list) and isinstance(answer, list):
                got = _as_text([*prompt, *answer], tok)
                if got is not None:
                    best = max(best, tok.count(got[0], special=got[1]))
                continue
            p, a = _as_text(prompt, tok), _as_text(answer, tok)
            if p is not None and a is not None:
                best = max(best, tok.count(p[0] + a[0]))
        return best or None
    return None


def local_tokenizer(spec: JobSpec) -> tuple[_Tokenizer | None, str | None, str]:
    """(tokenizer, None, where) or (None, why it was skipped, where)."""
    name = spec.model.name_or_path
    if not looks_local(name):
        return (
            None,
            (
                f"the tokenizer of {name} is on the Hugging Face Hub; the preflight loads local tokenizers "
                "only (a model folder), and the API does not download"
            ),
            name,
        )
    folder = Path(name)
    if not (folder / "tokenizer.json").is_file():
        return None, f"{name} has no tokenizer.json (a fast tokenizer) for the preflight to load", name
    try:
        return _Tokenizer(folder), None, name
    except ImportError as exc:
        return None, f"the API cannot load tokenizers here ({exc.name} is not installed)", name
    except Exception as exc:
        return None, f"the tokenizer in {name} did not load: {str(exc).splitlines()[0][:200]}", name


def _sample(path: Path, spec: JobSpec, sample_rows: int) -> _Sample:
    """The file's sample, counted with the spec's tokenizer: kept from an earlier request on the same
    file, tokenizer and fields (see _samples), or read and counted now."""
    key = _sample_key(path, spec, sample_rows) if looks_local(spec.model.name_or_path) else None
    if key is not None:
        kept = _samples.get(key)
        if kept is not None:
            return kept
    rows, ended, read, size = read_sample(path, sample_rows)
    tok, why, where = local_tokenizer(spec)
    if tok is None:
        return _Sample(len(rows), ended, read, size, where, None, why)
    lengths = [n for n in (sample_length(r, spec, tok) for r in rows) if n is not None]
    sample = _Sample(len(rows), ended, read, size, where, lengths)
    if key is not None:
        _samples.put(key, sample)
    return sample


def analyse(
    spec: JobSpec,
    path: Path | None,
    *,
    source: str,
    known_rows: int | None,
    sample_rows: int,
) -> DatasetPreflight:
    """The dataset preflight of a spec whose training data is the .jsonl file at `path` (None: data the
    preflight cannot read, such as a Hub dataset or a folder; only the batch arithmetic is given)."""
    tr, res = spec.training, spec.resources
    effective = tr.per_device_train_batch_size * tr.gradient_accumulation_steps * res.world_size
    out = DatasetPreflight(
        source=source, max_seq_len=tr.max_seq_len, effective_batch_size=effective, rows=known_rows
    )
    out.rows_exact = known_rows is not None
    if path is None:
        out.skipped = "the preflight reads .jsonl files only (a local file or an upload)"
        return _run_tokens(out, spec, mean=None)
    sample = _sample(path, spec, sample_rows)
    out.sample_rows = sample.rows
    out.sampled = not sample.ended
    if out.rows is None:
        if sample.ended:
            out.rows, out.rows_exact = sample.rows, True
        elif sample.read:
            out.rows = round(sample.rows * sample.size / sample.read)
    if sample.lengths is None:
        out.skipped = sample.why
        return _run_tokens(out, spec, mean=None)
    out.tokenizer = sample.tokenizer
    lengths = sample.lengths
    if not lengths:
        out.skipped = "no row of the sample holds a field the job trains on"
        return _run_tokens(out, spec, mean=None)
    out.tokens_per_sample = token_stats(lengths)
    scale = (out.rows or len(lengths)) / len(lengths)
    over = sum(1 for n in lengths if n > tr.max_seq_len)
    out.truncated_samples = round(over * scale)
    out.truncated_fraction = over / len(lengths)
    out.total_tokens = round(sum(lengths) * scale)
    out.train_tokens_per_epoch = round(sum(min(n, tr.max_seq_len) for n in lengths) * scale)
    rows_total = out.rows or len(lengths)
    sequences = math.ceil(out.train_tokens_per_epoch / tr.max_seq_len) if tr.packing else rows_total
    out.steps_per_epoch = max(1, math.ceil(sequences / effective))
    mean_tokens = tr.max_seq_len if tr.packing else out.train_tokens_per_epoch / max(1, rows_total)
    return _run_tokens(out, spec, mean=mean_tokens)


def _run_tokens(out: DatasetPreflight, spec: JobSpec, *, mean: float | None) -> DatasetPreflight:
    """The epochs the run covers and its tokens (`mean`: tokens per trained sequence; None: unknown)."""
    tr = spec.training
    if tr.num_train_epochs is not None:
        out.epochs = tr.num_train_epochs
    elif out.steps_per_epoch:
        out.epochs = (tr.max_steps or 0) / out.steps_per_epoch
    if mean is not None:
        if tr.max_steps is not None:
            out.run_tokens = round(tr.max_steps * out.effective_batch_size * mean)
        elif out.train_tokens_per_epoch is not None and tr.num_train_epochs is not None:
            out.run_tokens = round(out.train_tokens_per_epoch * tr.num_train_epochs)
    return out
