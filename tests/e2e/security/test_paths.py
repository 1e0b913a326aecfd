"""Local paths in specs stay under FTQ_LOCAL_ROOTS (symlinks resolved); run directories are the server's.

Against the shared `ftq api`, which keeps the default roots (its data dir and examples/). Its data dir
also holds every owner's run directories and the store: those must stay out of reach of a spec.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.security.common import TOKENS, base_spec
from tests.harness import Deployment, config_only_model, text_dataset

ALICE, BOB = TOKENS["alice"], TOKENS["bob"]


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside every root, holding a valid-looking model and dataset."""
    d = tmp_path_factory.mktemp("outside").resolve()
    config_only_model(d / "model")
    text_dataset(d / "secret.jsonl")
    return d


@pytest.fixture(scope="module")
def root(shared: Deployment, outside: Path) -> Path:
    """The shared server's data dir (a default root), with symlinks in it pointing out and in."""
    root = shared.data_dir.resolve()
    (root / "link-model-out").symlink_to(outside / "model")
    (root / "link-data-out.jsonl").symlink_to(outside / "secret.jsonl")
    (root / "link-dir-out").symlink_to(outside)
    (root / "link-etc").symlink_to("/etc")
    (root / "link-model-in").symlink_to(root / "model")
    # A relative symlink that climbs out.
    (root / "data" / "up.jsonl").symlink_to(os.path.relpath(outside / "secret.jsonl", root / "data"))
    return root


@pytest.fixture(scope="module")
def server(shared: Deployment, root: Path) -> Deployment:
    return shared


def _post(server: Deployment, spec: dict[str, Any], token: str = ALICE, dry: bool = True) -> Any:
    with server.client(token) as c:
        return c.post("/jobs", params={"dry_run": "true"} if dry else {}, json=spec)


def _with(section: str, value: str) -> dict[str, Any]:
    spec = base_spec()
    spec[section]["name_or_path"] = value
    return spec


def _assert_refused(r: Any, section: str) -> None:
    assert r.status_code == 422, r.text
    locs = [e["loc"] for e in r.json()["detail"]]
    assert ["body", section, "name_or_path"] in locs, locs


REFUSED_MODEL = [
    "./link-model-out",
    "./link-dir-out/model",
    "./link-etc",
    "./../../etc",
    "../../../../../../etc",
    "./model/../../../../../../etc",
    "/etc",
    "/",
    "/proc/self/root/etc",
    "./does-not-exist",
]
REFUSED_DATA = [
    "./link-data-out.jsonl",
    "./link-dir-out/secret.jsonl",
    "./data/up.jsonl",
    "./../../etc/passwd",
    "../../../../../../../etc/passwd",
    "./data/../../../../../../etc/passwd",
    "/etc/passwd",
    "/etc/../etc/passwd",
    "data/../../../../../../etc/x.jsonl",
    "./link-etc/passwd",
]


@pytest.mark.parametrize("value", REFUSED_MODEL)
def test_model_path_outside_the_roots_is_refused(server: Deployment, value: str) -> None:
    _assert_refused(_post(server, _with("model", value)), "model")


@pytest.mark.parametrize("value", REFUSED_DATA)
def test_dataset_path_outside_the_roots_is_refused(server: Deployment, value: str) -> None:
    _assert_refused(_post(server, _with("dataset", value)), "dataset")


def test_outside_paths_are_refused_by_absolute_name_too(server: Deployment, outside: Path) -> None:
    _assert_refused(_post(server, _with("model", str(outside / "model"))), "model")
    _assert_refused(_post(server, _with("dataset", str(outside / "secret.jsonl"))), "dataset")
    # NUL and line breaks never reach the file system.
    _assert_refused(_post(server, _with("dataset", "./data/train.jsonl\x00.jsonl")), "dataset")
    _assert_refused(_post(server, _with("model", "./model\n")), "model")


def test_paths_inside_are_stored_resolved(server: Deployment, root: Path) -> None:
    # A symlink that stays inside the root is fine; the job stores where it really points.
    r = _post(server, _with("model", "./link-model-in"), dry=False)
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["model"]["name_or_path"] == str(root / "model")
    assert spec["dataset"]["name_or_path"] == str(root / "data" / "train.jsonl")
    r = _post(server, _with("dataset", str(root / "data" / "train.jsonl")), dry=False)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "where",
    [(), ("training",), ("resources",), ("model",), ("dataset",), ("resources", "slurm")],
    ids=lambda w: ".".join(w) or "root",
)
def test_a_spec_cannot_choose_its_run_directory(
    server: Deployment, tmp_path: Path, where: tuple[str, ...]
) -> None:
    for key in ("output_dir", "run_dir", "logging_dir"):
        spec = base_spec()
        node = spec
        for part in where:
            node = node.setdefault(part, {})
        node[key] = str(tmp_path / "mine")
        r = _post(server, spec)
        assert r.status_code == 422, r.text
        assert any(e["loc"][-1] == key for e in r.json()["detail"]), r.text
    assert not (tmp_path / "mine").exists()


def test_the_server_picks_the_run_directory(server: Deployment) -> None:
    r = _post(server, base_spec(), dry=False)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    with server.client(ALICE) as c:
        plan = c.get(f"/jobs/{job_id}/plan").json()
    run_dir = server.data_dir.resolve() / "runs" / job_id
    assert plan["trainer_args"]["output_dir"] == str(run_dir)
    assert plan["trainer_args"]["spec"] == str(run_dir / "spec.json")


# The default roots: the data dir holds other owners' runs and the store ---------------------------------


@pytest.fixture(scope="module")
def default_roots(server: Deployment) -> Deployment:
    """The operator placed a model and data in the data dir: the default roots serve them."""
    config_only_model(server.data_dir / "models" / "tiny")
    text_dataset(server.data_dir / "datasets" / "train.jsonl")
    return server


def _data_spec(model: str = "./models/tiny", data: str = "./datasets/train.jsonl") -> dict[str, Any]:
    spec = base_spec()
    spec["model"]["name_or_path"] = model
    spec["dataset"]["name_or_path"] = data
    return spec


def test_default_roots_serve_the_operators_files(default_roots: Deployment) -> None:
    r = _post(default_roots, _data_spec())
    assert r.status_code == 200, r.text


def test_another_owners_run_directory_is_out_of_reach(default_roots: Deployment) -> None:
    r = _post(default_roots, _data_spec(), token=ALICE, dry=False)
    assert r.status_code == 201, r.text
    alice_job = r.json()["id"]
    run = default_roots.data_dir / "runs" / alice_job
    # What a finished run leaves behind: a final model, metrics, a log.
    config_only_model(run / "final")
    text_dataset(run / "metrics.jsonl")
    (run / "train.log").write_text("alice's log\n")

    rel = f"./runs/{alice_job}"
    attempts = [
        ("model", f"{rel}/final"),
        ("model", str((run / "final").resolve())),
        ("dataset", f"{rel}/metrics.jsonl"),
        ("dataset", f"runs/{alice_job}/metrics.jsonl"),
        ("dataset", f"{rel}"),
        ("dataset", "./runs"),
        ("dataset", "."),
        ("dataset", "./"),
        ("model", "."),
        ("dataset", "./broker"),
    ]
    for section, value in attempts:
        spec = _data_spec()
        spec[section]["name_or_path"] = value
        r = _post(default_roots, spec, token=BOB)
        _assert_refused(r, section)
    # Bob's own symlink trick is no better: a link in the operator's folder to alice's run.
    os.symlink(run / "final", default_roots.data_dir / "models" / "alias")
    _assert_refused(_post(default_roots, _data_spec(model="./models/alias"), token=BOB), "model")


def test_an_owner_may_build_on_their_own_run(default_roots: Deployment) -> None:
    r = _post(default_roots, _data_spec(), token=ALICE, dry=False)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    config_only_model(default_roots.data_dir / "runs" / job_id / "final")
    r = _post(default_roots, _data_spec(model=f"./runs/{job_id}/final"), token=ALICE)
    assert r.status_code == 200, r.text
    # ... which stays another owner's run for bob.
    _assert_refused(_post(default_roots, _data_spec(model=f"./runs/{job_id}/final"), token=BOB), "model")
