"""What a spec may name inside the data dir (service/paths.py), through the API in process: issue 28,
finding 1 (bob read alice's uploads by naming `./files/<sha256("alice")[:32]>` as his dataset)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from ftq.runtime.settings import DATA_DIR_STATE, get_settings
from tests.harness.inprocess import MakeClient

ALICE, BOB = {"Authorization": "Bearer a-tok"}, {"Authorization": "Bearer b-tok"}


def _dry(client: Any, spec: dict[str, Any], headers: dict[str, str]) -> Any:
    return client.post("/jobs", params={"dry_run": "true"}, json=spec, headers=headers)


def _refusal(r: Any, section: str) -> str:
    assert r.status_code == 422, r.text
    errors = [e for e in r.json()["detail"] if e["loc"] == ["body", section, "name_or_path"]]
    assert errors and errors[0]["type"] == "path_refused", r.text
    return str(errors[0]["msg"])


def test_a_spec_names_nothing_of_ftq_s_own_state_in_the_data_dir(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any], tiny_dir: Path
) -> None:
    client = make_client(store_url, api_tokens="a-tok:alice,b-tok:bob")
    data = get_settings().data_path
    upload = client.post(
        "/files",
        content=(tiny_dir / "data" / "train.jsonl").read_bytes(),
        headers={**ALICE, "Content-Type": "application/jsonl"},
    )
    assert upload.status_code == 201, upload.text
    file_id = upload.json()["id"]
    alice_dir = f"files/{hashlib.sha256(b'alice').hexdigest()[:32]}"
    assert (data / alice_dir / f"{file_id}.jsonl").is_file()
    # What else ftq keeps there: the artifact hash cache, the locks (made on first use).
    for name in ("artifact-hashes", "locks"):
        (data / name).mkdir(exist_ok=True)
        (data / name / "x.jsonl").write_text('{"text": "x"}\n')

    attacks = [
        f"./{alice_dir}",
        f"./{alice_dir}/{file_id}.jsonl",
        f"{data}/{alice_dir}/{file_id}.jsonl",
        f"./{alice_dir}/file_00000000000000000000000000.jsonl",  # no such file: the same answer
        "./files",
        "./artifact-hashes/x.jsonl",
        "./locks/x.jsonl",
        "./broker",
        "./ftq.db",
        "./ftq.db-wal",
        "./.hidden.jsonl",
        f"{alice_dir}/{file_id}.jsonl",  # read as a path for its suffix
    ]
    answers = set()
    for value in attacks:
        spec = json.loads(json.dumps(tiny_job))
        spec["dataset"]["name_or_path"] = value
        msg = _refusal(_dry(client, spec, BOB), "dataset")
        assert file_id not in msg.replace(value, ""), msg  # nothing beyond what was asked is told
        answers.add(msg.replace(value, "<path>"))
        assert client.post("/jobs", json=spec, headers=BOB).status_code == 422
    # The same answer whether the file exists or not: no oracle for another owner's file ids.
    assert len(answers) == 1, answers
    # A name without ./ is a hub id: "did you mean ./files/..." would say the folder exists.
    spec = json.loads(json.dumps(tiny_job))
    spec["dataset"]["name_or_path"] = alice_dir
    r = _dry(client, spec, BOB)
    assert "did you mean" not in r.text and file_id not in r.text, r.text
    # Alice herself names her upload by file_id, not by its place on disk.
    spec["dataset"]["name_or_path"] = f"./{alice_dir}/{file_id}.jsonl"
    _refusal(_dry(client, spec, ALICE), "dataset")
    # Every name ftq keeps at the top of the data dir is refused, model or dataset.
    for name in DATA_DIR_STATE:
        spec = json.loads(json.dumps(tiny_job))
        spec["model"]["name_or_path"] = f"./{name}/model"
        _refusal(_dry(client, spec, BOB), "model")

    # The operator's own files beside ftq's state stay usable.
    shutil.copytree(tiny_dir / "data", data / "datasets")
    spec = json.loads(json.dumps(tiny_job))
    spec["dataset"]["name_or_path"] = "./datasets/train.jsonl"
    r = _dry(client, spec, BOB)
    assert r.status_code == 200, r.text
