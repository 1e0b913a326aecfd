"""Which lm-eval task index an evaluation builds: its own folder's alone when that folder defines every
task the suite names (the full index reads every YAML lm-eval ships, ~6 CPU-s an evaluation)."""

from __future__ import annotations

from pathlib import Path

from ftq.contract.evaluation import LmEvalSuite
from tests.harness import REPO
from trainer.evaluate import _local_task_manager

TASKS = REPO / "examples" / "evaluation" / "tasks"


def _suite(tasks: list[str], task_dir: Path | None) -> LmEvalSuite:
    return LmEvalSuite.model_validate(
        {"name": "bench", "type": "lm_eval", "tasks": tasks, "task_dir": str(task_dir) if task_dir else None}
    )


def test_a_suite_of_its_folders_tasks_indexes_that_folder_alone() -> None:
    local = _local_task_manager(_suite(["tiny_mc"], TASKS))
    assert local is not None and local.all_tasks == ["tiny_mc"]


def test_a_suite_naming_a_built_in_task_or_without_a_folder_gets_no_local_index() -> None:
    assert _local_task_manager(_suite(["tiny_mc", "hellaswag"], TASKS)) is None
    assert _local_task_manager(_suite(["hellaswag"], None)) is None


def test_a_local_group_gets_the_full_index_its_built_in_members_need(tmp_path: Path) -> None:
    # Indexed alone, the folder would make lm-eval read the group's built-in member as an inline task.
    (tmp_path / "mix.yaml").write_text("group: mix\ntask:\n  - hellaswag\n")
    assert _local_task_manager(_suite(["mix"], tmp_path)) is None
