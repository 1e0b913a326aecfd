"""Checks made before a job is accepted: local paths resolved inside the allowed roots, the files they
name looked at as ftq.runtime.userfiles allows (regular files, never blocking, never read whole), and the
memory and disk estimate against what the job asks for and the host has.

Every step that touches the file system runs in a small pool of its own against one deadline for the
request (FTQ_PREFLIGHT_TIMEOUT_SECONDS): a slow or hostile path costs that request a 422, and never
holds the API's threads past the deadline.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ftq.contract.datasets import detect_formats, format_problem, suite_prompt
from ftq.contract.plans import DatasetPreflight, DiskEstimate, Estimate
from ftq.contract.spec import DatasetSpec, JobSpec, TrainingSpec, looks_local
from ftq.planning import dataset_preflight as dataset_preflight_mod
from ftq.planning import estimate as est
from ftq.runtime import limits, userfiles
from ftq.runtime.settings import Settings
from ftq.store.repository import JobRepository
from service.errors import SpecError, spec_field_error
from service.paths import PathRefused, StateRule, resolve_local

T = TypeVar("T")

# File-system work of every request's preflight. Bounded: paths that hang (a stale network mount) can
# take these threads, but not the API's, and each request waits for them only until its deadline.
_FILES_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ftq-preflight")


class Deadline:
    """One request's time for its preflight; `run` does file-system work within what is left."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def run(self, fn: Callable[[], T]) -> T:
        left = self._end - time.monotonic()
        if left <= 0:
            raise self._expired()
        future = _FILES_POOL.submit(fn)
        try:
            return future.result(timeout=left)
        except FutureTimeout:
            future.cancel()
            raise self._expired() from None

    def _expired(self) -> SpecError:
        return spec_field_error(
            [],
            f"checking the spec's local files took longer than FTQ_PREFLIGHT_TIMEOUT_SECONDS="
            f"{self.seconds:g} s; name files on a local disk, or fewer of them",
            "preflight_timeout",
        )


def resolve_paths(spec: JobSpec, settings: Settings, repo: JobRepository, deadline: Deadline) -> JobSpec:
    """Local model, adapter and dataset paths become absolute, symlink-free paths under the allowed
    roots, outside ftq's own state and other owners' run directories."""
    roots = settings.allowed_roots
    resolved = spec.model_copy(deep=True)

    def own_run(job_id: str) -> bool:
        # In this thread: the ownership check reads the store through the request's session.
        return repo.get(job_id) is not None

    fields: list[tuple[Any, str, list[Any]]] = [
        (getattr(resolved, section), key, [section, key])
        for section, key in (("model", "name_or_path"), ("model", "adapter"), ("dataset", "name_or_path"))
    ]
    # Evaluation suites' files: a graders or loss suite's dataset, an lm_eval suite's task folder.
    for i, suite in enumerate(resolved.eval.suites):
        key = "task_dir" if suite.type == "lm_eval" else "dataset"
        fields.append((suite, key, ["eval", "suites", i, key]))
    for part, key, loc in fields:
        original = getattr(part, key)
        if original is None:  # dataset.file_id: an upload, resolved by the worker at launch
            continue
        if loc[0] == "eval" and not looks_local(original):
            raise spec_field_error(
                loc, f"{original!r} must be a local path: write it with ./ or /", "path_refused"
            )
        # One rule for every path a spec names (service/paths.py): ftq's state in the data dir is out
        # of reach, and so are other owners' run directories.
        rule = StateRule(settings.data_path, settings.runs_dir)
        try:
            twin = deadline.run(functools.partial(_local_twin, original, roots, rule))
            if twin is not None and _owned(rule, twin, own_run):
                raise spec_field_error(
                    loc,
                    f"did you mean ./{original}? {twin} exists under the allowed local roots, but "
                    f"`{original}` is read as a Hugging Face Hub id; write a local path with ./ or /",
                    "ambiguous_path",
                )
            rule.run_ids.clear()
            try:
                setattr(part, key, deadline.run(functools.partial(resolve_local, original, roots, rule)))
            except PathRefused as refused:
                rule.check_owners(original, own_run)  # the same answer whether the path exists or not
                raise _with_suggestion(refused, original, roots, settings, deadline) from None
            if looks_local(original):
                rule.check_owners(original, own_run, getattr(part, key))
        except PathRefused as exc:
            raise spec_field_error(loc, str(exc), "path_refused") from None
    return resolved


# What resolve_local says of a path that is not there (not a refusal by the state rule, which must not
# be answered with a path that exists).
_NOT_THERE = (
    "was not found under the allowed local roots",
    "is outside the allowed local roots",
    "does not exist",
)


def _with_suggestion(
    refused: PathRefused, original: str, roots: list[Path], settings: Settings, deadline: Deadline
) -> PathRefused:
    """The refusal of a path that is not there, with `did you mean ./x?` when a path under the allowed
    roots is likely the one meant (`examples/tiny/data/train.jsonl` written from the checkout, where
    examples/ is a root: `./tiny/data/train.jsonl`)."""
    if not any(words in str(refused) for words in _NOT_THERE):
        return refused
    rule = StateRule(settings.data_path, settings.runs_dir)
    try:
        meant = deadline.run(functools.partial(suggest_path, original, roots, rule))
    except SpecError:  # out of time: the refusal alone
        return refused
    return PathRefused(f"{refused}; did you mean `{meant}`?") if meant else refused


def suggest_path(name: str, roots: list[Path], rule: StateRule) -> str | None:
    """`./x` for the existing path under the allowed roots that `name` most likely meant: the longest tail
    of `name` that is there (`examples/tiny/data/x.jsonl` -> `./tiny/data/x.jsonl`, an absolute path
    from another checkout likewise), else a close spelling of its last part in the folder that is there
    (`./tiny/data/trian.jsonl` -> `./tiny/data/train.jsonl`). Never a path the state rule refuses, nor
    one in a run directory (it may be another owner's), nor one outside the roots: what it names is
    something the spec may name anyway."""
    parts = [p for p in Path(name).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        return None

    def allowed(root: Path, tail: list[str]) -> Path | None:
        candidate = root.joinpath(*tail).resolve()
        if not candidate.is_relative_to(root) or candidate == root:
            return None
        try:
            rule(candidate, name)
        except PathRefused:
            return None
        if rule.run_of(str(candidate)) is not None:
            return None
        return candidate

    roots = [r.resolve() for r in roots]
    for start in range(len(parts)):
        for root in roots:
            found = allowed(root, parts[start:])
            if found is not None and found.exists():
                return "./" + "/".join(parts[start:])
    for start in range(len(parts)):
        for root in roots:
            folder = allowed(root, parts[start:-1]) if parts[start:-1] else root
            if folder is None or not folder.is_dir():
                continue
            try:
                entries = sorted(e.name for e in itertools.islice(os.scandir(folder), 1000))
            except OSError:
                continue
            close = difflib.get_close_matches(parts[-1], entries, n=1, cutoff=0.8)
            if close and allowed(root, [*parts[start:-1], close[0]]) is not None:
                return "./" + "/".join([*parts[start:-1], close[0]])
    return None


def hub_offline_problems(spec: JobSpec, offline: bool | None = None) -> list[dict[str, Any]]:
    """Refusals for the hub models and dataset a spec names when the service is offline (HF_HUB_OFFLINE=1
    in its environment, which the runs inherit): the run's fetch step asks the Hub for each repo's files
    before training, and fails at once when it may not (trainer.fetch), even for a repo in the cache."""
    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if not offline:
        return []
    found = [(["model", "name_or_path"], spec.model.name_or_path), (["model", "adapter"], spec.model.adapter)]
    found.append((["dataset", "name_or_path"], spec.dataset.name_or_path))
    return [
        {
            "loc": ["body", *loc],
            "msg": f"{name} is a Hugging Face Hub id, and this server is offline (HF_HUB_OFFLINE=1 in its "
            "environment): the run's fetch step could not download it; name a local path (./folder) "
            "under the allowed roots, or ask the operator",
            "type": "hub_offline",
        }
        for loc, name in found
        if name is not None and not looks_local(name)
    ]


def _owned(rule: StateRule, path: str, own_run: Callable[[str], bool]) -> bool:
    job_id = rule.run_of(path)
    return job_id is None or own_run(job_id)


def _local_twin(name: str, roots: list[Path], rule: StateRule) -> str | None:
    """The folder or file under the allowed roots that a hub id names when read as a relative path
    (`tiny/model` for ./tiny/model), unless the hub cache holds it: that name is then a hub id in use.
    Without this, a path written without ./ went to the Hub and failed only after its retries. A path
    the rule refuses is never named (it would tell that it exists)."""
    if looks_local(name) or est.load_model_config(name)[0] is not None:
        return None
    for root in roots:
        candidate = (root / name).resolve()
        if not candidate.is_relative_to(root):
            continue
        try:
            rule(candidate, name)
        except PathRefused:
            continue
        if candidate.exists():
            return str(candidate)
    return None


@dataclass
class _Files:
    """What preflight learns from the file system, gathered in one trip to the pool."""

    config: dict[str, Any] | None = None
    reason: str | None = None
    refusals: list[dict[str, Any]] = field(default_factory=list)
    disk_free: int = 0


def _look_at_files(spec: JobSpec, settings: Settings) -> _Files:
    out = _Files()
    cap = settings.max_config_bytes
    out.config, out.reason = est.load_model_config(spec.model.name_or_path, max_bytes=cap)
    # A folder without weights would fail in the trainer after the queue; say so now (a dry run still
    # answers with the plan, since the estimate needs only config.json).
    problem = est.local_model_problem(spec.model.name_or_path, max_config_bytes=cap)
    if problem:
        out.refusals.append({"loc": ["body", "model", "name_or_path"], "msg": problem, "type": "model_error"})
    problem = local_dataset_problem(spec.dataset.name_or_path) if spec.dataset.name_or_path else None
    if problem:
        out.refusals.append(
            {"loc": ["body", "dataset", "name_or_path"], "msg": problem, "type": "dataset_error"}
        )
    elif missing := missing_dataset_field(spec.dataset, spec.training):
        loc, msg = missing
        out.refusals.append({"loc": ["body", *loc], "msg": msg, "type": "dataset_error"})
    if problem := chat_template_problem(spec):
        out.refusals.append({"loc": ["body", "training", "loss_on"], "msg": problem, "type": "model_error"})
    out.refusals += suite_dataset_problems(spec)
    if problem := tool_calls_problem(spec):
        out.refusals.append(
            {"loc": ["body", "dataset", "name_or_path"], "msg": problem, "type": "dataset_error"}
        )
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    out.disk_free = shutil.disk_usage(settings.runs_dir).free
    return out


# What the first bytes of a data file must be for its suffix (after a UTF-8 BOM and white space for the
# text formats): a file that cannot be one would fail in the trainer after the queue.
_JSON_STARTS = {".jsonl": b"{", ".json": b"{["}
_MAGIC = {".parquet": (b"PAR1",), ".arrow": (b"ARROW1", b"\xff\xff\xff\xff")}


def local_dataset_problem(name_or_path: str) -> str | None:
    """Why a local dataset cannot be read as its suffix says, from its first and last bytes alone; None
    when it can (or when it is a hub id or a folder, which the trainer reads by its contents)."""
    if not looks_local(name_or_path):
        return None
    path = Path(name_or_path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return f"{name_or_path} does not exist"
    if stat.S_ISDIR(mode):
        return None
    try:
        head, tail, size = userfiles.read_ends(path)
    except userfiles.NotReadable as exc:
        return f"{name_or_path} {exc}"
    if size == 0:
        return f"{name_or_path} is empty"
    suffix = path.suffix.lower()
    if suffix in _JSON_STARTS:
        text = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
        if text and text[:1] not in _JSON_STARTS[suffix]:
            what = "JSON Lines (one object per line)" if suffix == ".jsonl" else "JSON"
            return f"{name_or_path} is not {what}: it starts with byte 0x{text[0]:02x}"
    elif suffix in _MAGIC:
        magic = _MAGIC[suffix]
        ok = head.startswith(magic) and (suffix != ".parquet" or tail.endswith(b"PAR1"))
        if not ok:
            return f"{name_or_path} is not a {suffix[1:]} file (its first bytes are not {magic[0]!r})"
    elif b"\x00" in head:
        return f"{name_or_path} is not a text file (it holds NUL bytes)"
    return None


# How much of a .jsonl file the field check reads, and how many of its rows it looks at.
_SNIFF_BYTES = 64 * 1024
_SNIFF_ROWS = 50


def missing_dataset_field(
    dataset: DatasetSpec, training: TrainingSpec | None = None
) -> tuple[tuple[str, ...], str] | None:
    """(field, why) when the first rows of a local .jsonl file lack a column the job's method and format
    need (ftq.contract.spec.FORMAT_COLUMNS, with dataset.text_field / messages_field for text and chat), as
    the
    trainer resolves `format: auto`; or when the format found cannot be masked as training.loss_on asks.
    `field` is the spec's path: the dataset field to rename, dataset.format when it was given, else
    training.method. None when the rows fit, or the file is not one this looks into (a folder, another
    format, a hub id, an upload)."""
    training = training or TrainingSpec(max_steps=1)
    if dataset.name_or_path is None or not looks_local(dataset.name_or_path):
        return None
    columns: dict[str, None] = {}
    formats: set[str] | None = None  # the formats every row read can be
    rows = _first_rows(Path(dataset.name_or_path))
    for row in rows:
        columns.update(dict.fromkeys(row))
        found = detect_formats(row)
        formats = found if formats is None else formats & found
    if not rows:
        return None
    where = f"the first {len(rows)} row(s) of {dataset.name_or_path}"
    return format_problem(dataset, training, list(columns), formats or set(), where)


def _first_rows(path: Path) -> list[dict[str, Any]]:
    """The first rows (objects) of a local .jsonl file, up to the first that is not one; none for another
    suffix or a file that cannot be read (local_dataset_problem says why)."""
    if path.suffix.lower() != ".jsonl":
        return []
    try:
        head, _, size = userfiles.read_ends(path, _SNIFF_BYTES)
    except userfiles.NotReadable:
        return []
    lines = head.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    if size > len(head):
        lines = lines[:-1]  # the last line read may be cut short
    rows: list[dict[str, Any]] = []
    for line in lines:
        if len(rows) >= _SNIFF_ROWS:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            break  # the trainer's reader reports a malformed row with its line; this only looks at fields
        if not isinstance(row, dict):
            break
        rows.append(row)
    return rows


def suite_dataset_problems(spec: JobSpec) -> list[dict[str, Any]]:
    """Refusals for graders suites whose local .jsonl dataset has, in its first rows, a row the evaluation
    could not prompt the model with (ftq.contract.datasets.suite_prompt): without this, the job trained
    and then every evaluation failed on that row (issue 50)."""
    refusals: list[dict[str, Any]] = []
    for i, suite in enumerate(spec.eval.suites):
        if suite.type != "graders" or suite.dataset is None or not looks_local(suite.dataset):
            continue
        for n, row in enumerate(_first_rows(Path(suite.dataset)), 1):
            _, why = suite_prompt(row, suite.prompt_field)
            if why:
                msg = f"{suite.dataset} row {n} {why}"
                refusals.append(
                    {"loc": ["body", "eval", "suites", i, "dataset"], "msg": msg, "type": "dataset_error"}
                )
                break
    return refusals


def chat_template_problem(spec: JobSpec) -> str | None:
    """Why `loss_on: assistant` cannot work with a local model's tokenizer: it has no chat template to
    mark assistant turns with. (A template without `{% generation %}` markers may still be one TRL knows
    how to patch: the trainer decides, and fails with a model_error naming the fix when it cannot.)"""
    if str(spec.training.loss_on) != "assistant" or not looks_local(spec.model.name_or_path):
        return None
    folder = Path(spec.model.name_or_path)
    if not folder.is_dir() or (folder / "chat_template.jinja").is_file():
        return None
    try:
        config = json.loads(userfiles.read_ends(folder / "tokenizer_config.json", 4 * 1024 * 1024)[0])
    except (userfiles.NotReadable, ValueError):
        return None  # the trainer reads the tokenizer and says what is wrong with it
    if isinstance(config, dict) and config.get("chat_template"):
        return None
    return (
        f"loss_on assistant masks everything but the assistant turns, which the chat template marks; the "
        f"tokenizer of {spec.model.name_or_path} has no chat template. Add one whose assistant turns are "
        "wrapped in {% generation %}...{% endgeneration %} (tokenizer_config.json chat_template, or "
        "chat_template.jinja), or use loss_on: all"
    )


def _local_chat_template(folder: Path) -> str | None:
    """A local model folder's chat template text (chat_template.jinja, else tokenizer_config.json's)."""
    try:
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            return userfiles.read_ends(jinja, 4 * 1024 * 1024)[0].decode("utf-8", "replace")
        config = json.loads(userfiles.read_ends(folder / "tokenizer_config.json", 4 * 1024 * 1024)[0])
    except (userfiles.NotReadable, ValueError, OSError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: [{name, template}]
        template = " ".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else None


def tool_calls_problem(spec: JobSpec) -> str | None:
    """OpenAI chat rows with `tool_calls` (in the first rows of a local .jsonl file) for a local model whose
    chat template never mentions tool calls, so cannot render them: the line of the first such row. The
    trainer checks every row with the tokenizer itself; this refuses the plain case before the queue."""
    ds = spec.dataset
    if (
        ds.name_or_path is None
        or not looks_local(ds.name_or_path)
        or not looks_local(spec.model.name_or_path)
    ):
        return None
    path, folder = Path(ds.name_or_path), Path(spec.model.name_or_path)
    if path.suffix.lower() != ".jsonl" or not folder.is_dir():
        return None
    template = _local_chat_template(folder)
    if template is None or "tool_calls" in template:
        return None  # no template: other checks say so; one that names tool_calls may render them
    try:
        head, _, size = userfiles.read_ends(path, _SNIFF_BYTES)
    except userfiles.NotReadable:
        return None
    lines = head.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    if size > len(head):
        lines = lines[:-1]
    for number, line in enumerate(lines[: _SNIFF_ROWS * 2], start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            return None
        messages = row.get(ds.messages_field) if isinstance(row, dict) else None
        if isinstance(messages, list) and any(isinstance(m, dict) and m.get("tool_calls") for m in messages):
            return (
                f"line {number} of {ds.name_or_path}: the chat template of {spec.model.name_or_path} cannot "
                "render tool_calls; use a model whose chat template renders tool calls, or leave them out"
            )
    return None


def pool_refusals(spec: JobSpec, settings: Settings) -> list[dict[str, Any]]:
    """A local job that asks for more GPUs (or CPU processes) than the worker pool has: it could only
    fail once it left the queue. The worker reads the same FTQ_GPU_POOL / FTQ_CPU_SLOTS as the API."""
    res = spec.resources
    beyond = (
        limits.beyond_local_pool(str(res.device), res.world_size, settings)
        if res.launcher == "local"
        else None
    )
    if beyond is None:
        return []
    loc, msg = beyond
    return [{"loc": ["body", "resources", loc], "msg": msg, "type": "not_available"}]


def preflight(
    spec: JobSpec, settings: Settings, owner: str, deadline: Deadline
) -> tuple[Estimate, list[dict[str, Any]]]:
    """The memory and disk estimate for the plan, and the refusals it implies (empty when it fits)."""
    files = deadline.run(functools.partial(_look_at_files, spec, settings))
    refusals = pool_refusals(spec, settings) + hub_offline_problems(spec) + files.refusals
    memory = _device_memory(spec, settings)
    if files.config is None:
        return Estimate(device_memory_bytes=memory, reason=files.reason), refusals
    room = _Room.of(spec, settings, owner)
    estimate = est.estimate_memory(
        spec, files.config, device_memory_bytes=memory, host_memory_bytes=room.node_bytes
    )
    if estimate.fits is False and not room.cpu:
        # On the plan too, so a dry run shows what would fit before anything is submitted.
        estimate.fix = est.suggest_fix(spec, files.config, memory, room.node_bytes)
        estimate.alternatives = est.suggest_alternatives(spec, files.config, memory, room.node_bytes)
    refusals += _memory_refusals(spec, settings, estimate, room)
    estimate.disk = est.estimate_disk(spec, files.config)
    estimate.disk.free_bytes = files.disk_free
    refusals += _disk_refusals(estimate.disk, room)
    return estimate, refusals


def _device_memory(spec: JobSpec, settings: Settings) -> int:
    """What one of the job's devices has: a GPU of its partition, or a CPU process's share of the host."""
    if spec.resources.device == "cpu":
        # A CPU job's "devices" are its processes, which share the host's RAM.
        return settings.host_memory_bytes // spec.resources.processes_per_node
    return settings.gpu_memory_bytes_for(spec.resources.slurm.partition or settings.slurm_partition)


@dataclass
class _Room:
    """Which limits past the device's memory bind this job: the node's RAM (cuda jobs), and whether
    allow_oversubscribe may skip the host's RAM and disk for this owner."""

    cpu: bool
    node_bytes: int | None
    # What allow_oversubscribe skips: the GPU estimate always; the host's RAM and disk only where the
    # operator lets this owner (a job past them fails for others too: swap, a full disk).
    skip_host: bool
    # Said after a host refusal that allow_oversubscribe did not skip.
    not_skipped: str

    @classmethod
    def of(cls, spec: JobSpec, settings: Settings, owner: str) -> _Room:
        cpu = spec.resources.device == "cpu"
        skip_host = spec.allow_oversubscribe and settings.oversubscribe_host_allowed(owner)
        return cls(
            cpu=cpu,
            node_bytes=(int(settings.node_memory_gb * 1024**3) or None) if not cpu else None,
            skip_host=skip_host,
            not_skipped=(
                " (allow_oversubscribe does not skip this check on this server: FTQ_ALLOW_OVERSUBSCRIBE)"
                if spec.allow_oversubscribe and not skip_host
                else ""
            ),
        )


def _memory_refusals(
    spec: JobSpec, settings: Settings, estimate: Estimate, room: _Room
) -> list[dict[str, Any]]:
    """A job whose estimate does not fit: a CPU job the host's RAM, a cuda job its GPUs or its node."""
    if estimate.fits is not False:
        return []
    if room.cpu:
        if room.skip_host:
            return []
        procs = spec.resources.processes_per_node
        need = (estimate.per_device_bytes or 0) * procs / 1024**3
        have = settings.host_memory_bytes / 1024**3
        msg = (
            f"estimated {need:.1f} GiB of host RAM for {procs} CPU process(es) does not fit "
            f"the host's {have:.1f} GiB (FTQ_HOST_MEMORY_GB); use fewer processes, a smaller "
            f"max_seq_len or batch, LoRA, or cuda{room.not_skipped}"
        )
        return [{"loc": ["body", "resources", "device"], "msg": msg, "type": "does_not_fit"}]
    # allow_oversubscribe launches past the GPU estimate; past the node's RAM only where the operator
    # lets this owner (an OOM-killed node takes other jobs down with it).
    gpu_over = (estimate.per_device_bytes or 0) > (estimate.usable_device_bytes or 0)
    host_over = estimate.host_fits is False
    if (gpu_over and not spec.allow_oversubscribe) or (host_over and not room.skip_host):
        msg = _does_not_fit(estimate) + (room.not_skipped if host_over else "")
        return [{"loc": ["body", "resources"], "msg": msg, "type": "does_not_fit"}]
    return []


def _disk_refusals(disk: DiskEstimate, room: _Room) -> list[dict[str, Any]]:
    """Checkpoints and the final model that would not fit the free space where runs are stored."""
    need, free = disk.total_bytes or 0, disk.free_bytes or 0
    if need <= free or room.skip_host:
        return []
    msg = (
        f"checkpoints and final model need about {userfiles.human_size(need)} but "
        f"{userfiles.human_size(free)} is free where runs are stored; raise save_steps or "
        f"set save_total_limit{room.not_skipped}"
    )
    return [{"loc": ["body", "training", "save_steps"], "msg": msg, "type": "disk_full"}]


def _does_not_fit(estimate: Estimate) -> str:
    """Why a cuda job does not fit (device memory, host RAM), the fix that keeps what it trains, and
    the alternatives that change it, labelled so."""
    gib = 1024**3
    parts = []
    need, usable = estimate.per_device_bytes or 0, estimate.usable_device_bytes or 0
    have = (estimate.device_memory_bytes or 0) / gib
    if need > usable:
        parts.append(
            f"estimated {need / gib:.1f} GiB per GPU does not fit {have:.0f} GiB"
            f" (a job may plan for {usable / gib:.1f} GiB of it; the rest is the allocator's)"
        )
    if estimate.host_fits is False:
        host, ram = estimate.host_bytes_per_node or 0, estimate.host_memory_bytes or 0
        biggest = max(estimate.host_breakdown, key=lambda k: estimate.host_breakdown[k])
        parts.append(
            f"estimated {host / gib:.0f} GiB of host RAM per node does not fit {ram / gib:.0f} GiB "
            f"(FTQ_NODE_MEMORY_GB; most of it: {biggest.replace('_', ' ')})"
        )
    msg = " and ".join(parts)
    msg += f"; {estimate.fix}" if estimate.fix else ""
    msg += "".join(f". {alt}" for alt in estimate.alternatives)
    return msg + " (set allow_oversubscribe: true to launch anyway)"


def dataset_preflight(
    spec: JobSpec, settings: Settings, deadline: Deadline, upload: tuple[Path, int | None] | None
) -> DatasetPreflight:
    """`plan.dataset` (ftq.planning.dataset_preflight): the training data's rows and tokens, read within the
    request's deadline. `upload` is the (path, rows) of the file `dataset.file_id` names."""
    if upload is not None:
        path: Path | None = upload[0]
        rows = upload[1]
    else:
        name = spec.dataset.name_or_path or ""
        path = Path(name) if looks_local(name) and name.lower().endswith(".jsonl") else None
        rows = None
        if path is not None and local_dataset_problem(name) is not None:
            path = None  # the refusal says why; nothing here to read
    return deadline.run(
        functools.partial(
            dataset_preflight_mod.analyse,
            spec,
            path,
            source=spec.dataset.source,
            known_rows=rows,
            sample_rows=settings.preflight_sample_rows,
        )
    )
