"""Datasets: load from the hub, a local folder or one file, pick the splits, hand them to TRL.

What reaches TRL is a dataset with one column: `text` (from `dataset.text_field`), to which TRL appends
EOS and which the tokenizer encodes with its special tokens (BOS), or `messages` (from
`dataset.messages_field`), which TRL tokenizes once with the chat template and nothing added: the
template alone decides BOS and EOS, exactly as `apply_chat_template` does at inference. Rendering chat
to text here and letting TRL tokenize that again would add a second BOS on Llama templates and an extra
EOS on templates that end with a newline.

Eval split rule (documented choice): when `eval_split` is set but the loaded dataset has only one split
(a single .jsonl/.json/.parquet file always loads as one split), a deterministic hold-out is cut from
it instead: `HOLDOUT_FRACTION` of the rows, at least 1 and at most `HOLDOUT_MAX` rows, shuffled with
`training.seed`. A dataset with several splits that lacks the named one is an error that lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftq.spec import DatasetSpec, looks_local

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
    format: str  # "text" or "messages": what the rows held before rendering
    eval_note: str  # where the eval rows came from, for the log


def load_splits(spec: DatasetSpec, seed: int) -> tuple[DatasetDict, Splits]:
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
    fmt = detect_format(spec, list(train.column_names))

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


def detect_format(spec: DatasetSpec, columns: list[str]) -> str:
    """`messages` or `text`, checking that the column the format needs is there."""
    fmt = str(spec.format)
    if fmt == "auto":
        fmt = "messages" if spec.messages_field in columns else "text"
    needed = spec.messages_field if fmt == "messages" else spec.text_field
    if needed not in columns:
        what = "messages" if fmt == "messages" else "text"
        setting = "dataset.messages_field" if fmt == "messages" else "dataset.text_field"
        raise DatasetError(
            f"dataset {spec.name_or_path} has no {what} column {needed!r} (columns: {', '.join(columns)}); "
            f"set {setting} (article flag --dataset_text_field) to one of them"
        )
    return fmt


def trl_rows(ds: Dataset, spec: DatasetSpec, fmt: str, tokenizer: Any) -> Dataset:
    """The rows as TRL takes them: one `text` column, or one `messages` column for chat data."""
    if fmt == "messages":
        if not getattr(tokenizer, "chat_template", None):
            raise DatasetError(
                f"dataset {spec.name_or_path} holds messages but the tokenizer has no chat template; "
                "use a chat model's tokenizer or a text dataset"
            )
        # Other columns stay behind: TRL would read `prompt`/`completion` or `tools` as instructions.
        out = _only_column(ds, spec.messages_field, MESSAGES_COLUMN)
        return out.filter(lambda row: isinstance(row[MESSAGES_COLUMN], list) and bool(row[MESSAGES_COLUMN]))

    out = _only_column(ds, spec.text_field, TEXT_COLUMN)
    # Rows with no text would be empty sequences: TRL cannot train on them.
    return out.filter(lambda row: isinstance(row[TEXT_COLUMN], str) and row[TEXT_COLUMN] != "")


def _only_column(ds: Dataset, field: str, name: str) -> Dataset:
    drop = [c for c in ds.column_names if c != field]
    out = ds.remove_columns(drop) if drop else ds
    return out.rename_column(field, name) if field != name else out
