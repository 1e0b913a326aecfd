"""Datasets: load from the hub, a local folder or one file, pick the splits, hand them to TRL.

Which columns a job reads follows its method and data format (ftq.contract.spec.METHOD_FORMATS,
FORMAT_COLUMNS):
prompt/completion, preference (prompt/chosen/rejected) and unpaired preference (prompt/completion/label)
rows reach TRL with those columns only. For text and chat, what reaches TRL is a dataset with one
column: `text` (from `dataset.text_field`), to which TRL appends EOS and which the tokenizer encodes
with its special tokens (BOS), or `messages` (from `dataset.messages_field`), which TRL tokenizes once
with the chat template and nothing added: the template alone decides BOS and EOS, exactly as
`apply_chat_template` does at inference. Rendering chat to text here and letting TRL tokenize that again
would add a second BOS on Llama templates and an extra EOS on templates that end with a newline.

Eval split rule (documented choice): when `eval_split` is set but the loaded dataset has only one split
(a single .jsonl/.json/.parquet file always loads as one split), a deterministic hold-out is cut from
it instead: `HOLDOUT_FRACTION` of the rows, at least 1 and at most `HOLDOUT_MAX` rows, shuffled with
`training.seed`. A dataset with several splits that lacks the named one is an error that lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftq.contract.spec import (
    FORMAT_COLUMNS,
    METHOD_FORMATS,
    DatasetSpec,
    auto_format,
    format_columns,
    looks_local,
)

from . import hub
from .errors import DatasetError

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

HOLDOUT_FRACTION = 0.05
HOLDOUT_MAX = 2000
TEXT_COLUMN = "text"
MESSAGES_COLUMN = "messages"  # the column TRL treats as a conversation
# datasets' builder names for the file suffixes a spec may name.
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


@dataclass
class Splits:
    train: Dataset
    eval: Dataset | None
    format: str  # the data format (ftq.contract.spec.FORMAT_COLUMNS) the rows were read as
    eval_note: str  # where the eval rows came from, for the log


def load_splits(spec: DatasetSpec, seed: int, method: str = "sft") -> tuple[DatasetDict, Splits]:
    """Load the dataset and pick train and eval splits, still in their source columns."""
    if spec.name_or_path is None:
        # dataset.file_id: the worker writes the upload's path into the run's spec.json.
        raise DatasetError(
            f"dataset.file_id {spec.file_id} was not resolved to a path; submit the job through ftq"
        )
    dsd = load_raw(spec.name_or_path)
    if spec.train_split not in dsd:
        raise DatasetError(
            f"dataset {spec.name_or_path} has no split {spec.train_split!r} (splits: {', '.join(dsd)}); "
            "set dataset.train_split"
        )
    train = dsd[spec.train_split]
    if len(train) == 0:
        raise DatasetError(f"split {spec.train_split!r} of dataset {spec.name_or_path} is empty")
    fmt = detect_format(spec, list(train.column_names), method)

    eval_ds, note = None, "no eval split"
    if spec.eval_split is not None:
        if spec.eval_split in dsd and spec.eval_split != spec.train_split:
            eval_ds, note = dsd[spec.eval_split], f"split {spec.eval_split!r}"
        elif len(dsd) == 1:
            n_eval = min(HOLDOUT_MAX, max(1, int(len(train) * HOLDOUT_FRACTION)))
            if n_eval >= len(train):
                raise DatasetError(
                    f"dataset {spec.name_or_path} has {len(train)} rows: too few to hold out an eval split"
                )
            parts = train.train_test_split(test_size=n_eval, shuffle=True, seed=seed)
            train, eval_ds = parts["train"], parts["test"]
            note = f"{n_eval} rows held out of {spec.train_split!r} (seed {seed})"
        else:
            raise DatasetError(
                f"dataset {spec.name_or_path} has no split {spec.eval_split!r} (splits: {', '.join(dsd)}); "
                "set dataset.eval_split to one of them or to null"
            )
    return dsd, Splits(train=train, eval=eval_ds, format=fmt, eval_note=note)


def load_raw(name_or_path: str) -> DatasetDict:
    """A DatasetDict from a hub id, a save_to_disk folder, a folder of data files, or one data file."""
    import datasets
    import datasets.exceptions

    try:
        if looks_local(name_or_path):
            path = Path(name_or_path)
            if not path.exists():
                raise DatasetError(f"dataset path {name_or_path} does not exist")
            if path.is_file():
                builder = _BUILDERS.get(path.suffix.lower())
                if builder is None:
                    raise DatasetError(
                        f"dataset file {name_or_path}: use .jsonl, .json, .parquet, .csv or .arrow"
                    )
                return _as_dict(datasets.load_dataset(builder, data_files={"train": str(path)}))
            if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
                return _as_dict(datasets.load_from_disk(str(path)))
            data_files = _split_files(path)
            if data_files:
                # One load per file: splits may differ in columns (datasets would insist they match).
                return datasets.DatasetDict(
                    {
                        split: datasets.load_dataset(
                            _BUILDERS[f.suffix.lower()], data_files=str(f), split="train"
                        )
                        for split, f in data_files.items()
                    }
                )
            return _as_dict(datasets.load_dataset(str(path)))
        problem = hub.unreachable_reason(name_or_path, "dataset")
        if problem:
            raise DatasetError(problem)
        return _as_dict(datasets.load_dataset(name_or_path))
    except DatasetError:
        raise
    except (
        FileNotFoundError,
        ValueError,
        ConnectionError,
        OSError,
        datasets.exceptions.DatasetsError,
    ) as err:
        # DatasetNotFoundError is a FileNotFoundError; offline hub lookups end as ConnectionError/OSError.
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DatasetError(f"cannot load dataset {name_or_path}: {first}") from err


def _split_files(folder: Path) -> dict[str, Path]:
    """`train.jsonl`, `eval.jsonl`, ... at the top of a folder: each file's stem names its split.

    datasets' own inference would file `eval.jsonl` under `test`; naming splits after files keeps
    `eval_split: eval` meaning what it says. Shard names (`train-00000-of-00002`) fall back to datasets.
    """
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in _BUILDERS]
    stems = [p.stem for p in files]
    if not files or len(set(stems)) != len(stems) or any("-of-" in s for s in stems):
        return {}
    return {p.stem: p for p in files}


def _as_dict(loaded: Any) -> DatasetDict:
    from datasets import Dataset, DatasetDict

    if isinstance(loaded, Dataset):
        return DatasetDict({"train": loaded})
    return loaded


def detect_format(spec: DatasetSpec, columns: list[str], method: str = "sft") -> str:
    """The data format the job trains on (ftq.contract.spec's table), checking that its columns are there."""
    fmt = str(spec.format)
    if fmt == "auto":
        fmt = auto_format(method, columns, spec.text_field, spec.messages_field)
    if fmt not in METHOD_FORMATS[method]:
        raise DatasetError(
            f"training.method {method} trains on {' or '.join(METHOD_FORMATS[method])} data, not {fmt}; "
            "set dataset.format"
        )
    missing = [c for c in format_columns(fmt, spec.text_field, spec.messages_field) if c not in columns]
    if not missing:
        return fmt
    if fmt in ("text", "messages"):
        what = "messages" if fmt == "messages" else "text"
        setting = "dataset.messages_field" if fmt == "messages" else "dataset.text_field"
        raise DatasetError(
            f"dataset {spec.name_or_path} has no {what} column {missing[0]!r} "
            f"(columns: {', '.join(columns)}); set {setting} (train.py flag --dataset_text_field) "
            "to one of them"
        )
    raise DatasetError(
        f"dataset {spec.name_or_path} has no column(s) {', '.join(missing)} (columns: {', '.join(columns)}), "
        f"which {fmt} data for training.method {method} needs"
    )


def trl_rows(ds: Dataset, spec: DatasetSpec, fmt: str, tokenizer: Any) -> Dataset:
    """The rows as TRL takes them: only the format's columns, under TRL's names (`text` or `messages` for
    SFT; prompt/completion; prompt/chosen/rejected; prompt/completion/label), without empty rows."""
    if fmt == "messages":
        if not getattr(tokenizer, "chat_template", None):
            raise DatasetError(
                f"dataset {spec.name_or_path} holds messages but the tokenizer has no chat template; "
                "use a chat model's tokenizer or a text dataset"
            )
        # Other columns stay behind: TRL would read `prompt`/`completion` or `tools` as instructions.
        out = _only_column(ds, spec.messages_field, MESSAGES_COLUMN)
        return out.filter(lambda row: isinstance(row[MESSAGES_COLUMN], list) and bool(row[MESSAGES_COLUMN]))
    if fmt == "text":
        out = _only_column(ds, spec.text_field, TEXT_COLUMN)
        # Rows with no text would be empty sequences: TRL cannot train on them.
        return out.filter(lambda row: isinstance(row[TEXT_COLUMN], str) and row[TEXT_COLUMN] != "")

    keep = list(FORMAT_COLUMNS[fmt])
    if fmt == "preference" and "prompt" in ds.column_names:
        keep.insert(0, "prompt")
    drop = [c for c in ds.column_names if c not in keep]
    out = ds.remove_columns(drop) if drop else ds
    conversational = [c for c in keep if c != "label" and _is_conversation(out[0][c])]
    if conversational and not getattr(tokenizer, "chat_template", None):
        raise DatasetError(
            f"dataset {spec.name_or_path} holds conversations in {', '.join(conversational)} but the "
            "tokenizer has no chat template; use a chat model's tokenizer or text columns"
        )
    if fmt == "unpaired_preference":
        labels = {type(v).__name__ for v in out["label"][:1000]}
        if labels - {"bool"}:
            raise DatasetError(
                f"dataset {spec.name_or_path}: column label must be true (desirable) or false (undesirable), "
                f"found {', '.join(sorted(labels))}"
            )
    texts = [c for c in keep if c != "label"]
    return out.filter(lambda row: all(_non_empty(row[c]) for c in texts))


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def _non_empty(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (isinstance(value, list) and bool(value))


def _only_column(ds: Dataset, field: str, name: str) -> Dataset:
    drop = [c for c in ds.column_names if c != field]
    out = ds.remove_columns(drop) if drop else ds
    return out.rename_column(field, name) if field != name else out
