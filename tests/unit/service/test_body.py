"""Errors a user meets first, sent as a user sends them, each naming its fix: a typo'd field, YAML with a
tab or a stray indent, YAML sent as JSON, a file whose newlines `curl -d` stripped, and a local path
written without ./ (which would otherwise be a Hub id)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.harness.inprocess import MakeClient

YAML = {"content-type": "application/yaml"}
DRY = "/jobs?dry_run=true"


def _detail(r: Any) -> str:
    body = r.json()
    detail = body["detail"]
    return detail if isinstance(detail, str) else " | ".join(e["msg"] for e in detail)


@pytest.mark.parametrize(
    ("where", "typo", "fix"),
    [
        (["training"], "learnig_rate", "did you mean `learning_rate`?"),
        (["model"], "name_or_pth", "did you mean `name_or_path`?"),
        ([], "learning_rate", "it belongs at `training.learning_rate`"),
        (["lora"], "zzz", "the fields here are `alpha`"),
    ],
)
def test_an_unknown_field_names_the_nearest_valid_one(
    make_client: MakeClient, tiny_job: dict[str, Any], where: list[str], typo: str, fix: str
) -> None:
    spec = copy.deepcopy(tiny_job)
    section = spec
    for part in where:
        section = section[part]
    section[typo] = 1
    r = make_client().post(DRY, content=yaml.safe_dump(spec), headers=YAML)
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", *where, typo]
    assert fix in err["msg"], err["msg"]


def test_invalid_yaml_gives_line_and_column_and_names_a_tab(
    make_client: MakeClient, tiny_job: dict[str, Any]
) -> None:
    client = make_client()
    text = yaml.safe_dump(tiny_job, sort_keys=False)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  name_or_path:"))
    lines[at] = "\t" + lines[at].lstrip()  # an editor that indents with a tab
    r = client.post(DRY, content="\n".join(lines) + "\n", headers=YAML)
    assert r.status_code == 400, r.text
    msg = _detail(r)
    assert f"line {at + 1}, column 1: a tab character" in msg and "spaces" in msg, msg

    r = client.post(
        DRY, content="name: x\nmodel:\n  name_or_path: ./tiny/model\n   revision: main\n", headers=YAML
    )
    assert r.status_code == 400, r.text
    assert "not valid YAML at line 4, column 12" in _detail(r), _detail(r)


def test_yaml_sent_as_json_says_to_send_application_yaml(
    make_client: MakeClient, tiny_job: dict[str, Any]
) -> None:
    r = make_client().post(
        DRY, content=yaml.safe_dump(tiny_job), headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert "send it with Content-Type: application/yaml" in _detail(r)
    # Broken JSON stays a JSON error: YAML would accept the trailing comma, but that is no reason to say so.
    r = make_client().post(DRY, content=b'{"name": "x",}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "application/yaml" not in _detail(r), r.text


def test_a_file_sent_with_curl_d_suggests_data_binary(
    make_client: MakeClient, tiny_job: dict[str, Any]
) -> None:
    client = make_client()
    # What `curl -d @spec.yaml` sends: the file without its newlines, as a form unless told otherwise.
    stripped = yaml.safe_dump(tiny_job).replace("\n", "")
    r = client.post(DRY, content=stripped, headers=YAML)
    assert r.status_code == 400, r.text
    assert "`curl --data-binary @spec.yaml`" in _detail(r) and "strips newlines" in _detail(r)

    r = client.post(DRY, content=stripped, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415, r.text
    assert "--data-binary @spec.yaml" in _detail(r) and "Content-Type: application/yaml" in _detail(r)

    r = client.post(DRY, content=stripped, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "application/yaml" in _detail(r) and "--data-binary" in _detail(r)

    # A one-line flow mapping is valid YAML, and is taken as it is.
    r = client.post(DRY, content=yaml.safe_dump(tiny_job, default_flow_style=True, width=10**6), headers=YAML)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("section", "written"), [("model", "tiny/model"), ("dataset", "tiny/data")])
def test_a_local_path_without_dot_slash_is_not_sent_to_the_hub(
    make_client: MakeClient, tiny_job: dict[str, Any], section: str, written: str
) -> None:
    # Both folders exist under examples/, one of the server's default roots.
    spec = copy.deepcopy(tiny_job)
    spec[section]["name_or_path"] = written
    r = make_client().post(DRY, json=spec)
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", section, "name_or_path"]
    assert err["msg"].startswith(f"did you mean ./{written}?"), err["msg"]
    # A hub id that names no folder under the roots is still a hub id.
    spec[section]["name_or_path"] = "some-owner/some-model"
    assert make_client().post(DRY, json=spec).status_code == 200


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        # From the checkout's folder, where examples/ is the server's root (issue 50).
        ("examples/tiny/data/train.jsonl", "./tiny/data/train.jsonl"),
        ("./examples/tiny/data/train.jsonl", "./tiny/data/train.jsonl"),
        # An absolute path from another checkout, outside the roots.
        ("/home/someone/ftq/examples/tiny/data/train.jsonl", "./tiny/data/train.jsonl"),
        # A typo in the file's name.
        ("./tiny/data/trian.jsonl", "./tiny/data/train.jsonl"),
    ],
)
def test_a_path_not_under_the_roots_is_answered_with_the_one_meant(
    make_client: MakeClient, tiny_job: dict[str, Any], written: str, meant: str
) -> None:
    spec = copy.deepcopy(tiny_job)
    spec["dataset"]["name_or_path"] = written
    r = make_client().post(DRY, json=spec)
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "dataset", "name_or_path"]
    assert err["msg"].endswith(f"; did you mean `{meant}`?"), err["msg"]
    # The suggestion is a path the spec may name: it is accepted as written.
    spec["dataset"]["name_or_path"] = meant
    assert make_client().post(DRY, json=spec).status_code == 200


def test_no_suggestion_names_what_is_outside_the_roots_or_in_a_run_directory(
    make_client: MakeClient, tiny_job: dict[str, Any], ftq_env: dict[str, str]
) -> None:
    from pathlib import Path

    # A file in some job's run directory (in the data dir, a root): never suggested, whoever's it is.
    run = Path(ftq_env["FTQ_DATA_DIR"]) / "runs" / "job_0123456789abcdef"
    run.mkdir(parents=True)
    (run / "secret.jsonl").write_text('{"text": "x"}\n')
    spec = copy.deepcopy(tiny_job)
    for written in (
        "./elsewhere/runs/job_0123456789abcdef/secret.jsonl",
        "./nowhere/at/all.jsonl",
        "/etc/passwd.jsonl",
    ):
        spec["dataset"]["name_or_path"] = written
        r = make_client().post(DRY, json=spec)
        assert r.status_code == 422, r.text
        assert "did you mean" not in r.text, r.text


def test_a_hub_model_on_an_offline_server_is_refused_before_launch(
    make_client: MakeClient, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = copy.deepcopy(tiny_job)
    spec["model"]["name_or_path"] = "some-owner/some-model"
    client = make_client()
    # Online: a hub model is the fetch step's, and the dry run has nothing to refuse.
    r = client.post(DRY, json=spec)
    assert r.status_code == 200 and r.json()["warnings"] == [], r.text
    assert "trainer.fetch" in r.json()["launch_script"]
    # Offline (HF_HUB_OFFLINE=1 in the service's environment, which its runs inherit): the fetch would fail.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = client.post(DRY, json=spec)
    assert r.status_code == 200, r.text
    [warning] = r.json()["warnings"]
    assert warning.startswith("model.name_or_path: some-owner/some-model is a Hugging Face Hub id"), warning
    assert "HF_HUB_OFFLINE=1" in warning
    r = client.post("/jobs", json=spec)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "hub_offline", r.text
