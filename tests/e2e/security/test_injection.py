"""Shell injection: every string a spec can carry is refused or reaches the launch only as data.

Every string field of JobSpec (found by walking its JSON schema, so a new field is covered without
editing this file) gets payloads with `$(...)`, backticks, `;`, quotes, newlines and `#SBATCH` lines.
Each answer is a 422, or a plan whose launch.sh and job.sbatch pass `bash -n` and then really run
under bash, with a stub interpreter standing in for `accelerate launch` (FTQ_PYTHON) and stubs for
`srun` and `scontrol`: the stub records the argv it got, which must be the plan's argv word for word,
and the marker file that every payload tries to create must never appear. Local paths are the one
place where free text is accepted, so the payloads are also created as real folders under the local
root and named as `./<payload>`.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from tests.e2e.security.common import TOKENS
from tests.harness import Deployment, config_only_model, text_dataset


def payloads(marker: Path) -> list[str]:
    m = str(marker)
    return [
        f"$(touch {m})",
        f"`touch {m}`",
        f"; touch {m}",
        f'\'"; touch {m}; "',
        f'x\n#SBATCH --wrap="touch {m}"',
        f"x\ntouch {m}",
        f"x && touch {m} #",
        f"$'\\x3b' ${{IFS}}touch${{IFS}}{m}",
    ]


def string_fields(schema: dict[str, Any]) -> list[tuple[str | int, ...]]:
    """Paths of every string the spec schema accepts (object properties, array items, enums)."""
    defs = schema.get("$defs", {})
    found: list[tuple[str | int, ...]] = []

    def walk(node: dict[str, Any], path: tuple[str | int, ...]) -> None:
        if "$ref" in node:
            walk(defs[node["$ref"].rsplit("/", 1)[-1]], path)
            return
        for alt in node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", []):
            walk(alt, path)
        kind = node.get("type")
        if kind == "string" or (kind is None and "enum" in node):
            if path not in found:
                found.append(path)
        elif kind == "object":
            for name, sub in node.get("properties", {}).items():
                walk(sub, (*path, name))
        elif kind == "array":
            walk(node.get("items", {}), (*path, 0))

    walk(schema, ())
    return found


def set_path(spec: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = spec
    for key, nxt in itertools.pairwise(path):
        if isinstance(key, int):
            while len(node) <= key:
                node.append({} if not isinstance(nxt, int) else [])
            node = node[key]
            continue
        if not isinstance(node.get(key), dict | list):
            node[key] = [] if isinstance(nxt, int) else {}
        node = node[key]
    last = path[-1]
    if isinstance(last, int):
        if len(node) <= last:
            node.extend([None] * (last + 1 - len(node)))
        node[last] = value
    else:
        node[last] = value


def slurm_spec() -> dict[str, Any]:
    """Valid and rendered for both launches: job.sbatch exists only for the slurm launcher."""
    return {
        "name": "inj",
        "model": {"name_or_path": "./model"},
        "dataset": {"name_or_path": "./data/train.jsonl"},
        "training": {"max_steps": 2, "max_seq_len": 32, "mixed_precision": "no"},
        "resources": {"launcher": "slurm", "device": "cpu", "processes_per_node": 1},
    }


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker") / "pwned"


@pytest.fixture(scope="module")
def server(shared: Deployment, marker: Path) -> Deployment:
    """The shared `ftq api` (its data dir path has a space and a quote, so run-dir paths in the
    scripts need quoting too), with the payloads as real model folders and dataset files in its root."""
    for i, p in enumerate(payloads(marker)):
        if "\n" in p:
            continue
        config_only_model(shared.data_dir / "m" / p)
        text_dataset(shared.data_dir / "d" / p / f"train{i}.jsonl")
    return shared


def sbatch_directives(script: str) -> list[str]:
    """What sbatch reads as options: `#SBATCH` lines before the first command line."""
    out = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            out.append(line)
        elif line.strip() and not line.startswith("#"):
            break
    return out


def run_scripts(plan: dict[str, Any], work: Path, stubs: Path, marker: Path) -> None:
    """bash -n, then a real run of launch.sh and job.sbatch with the stubs; the argv must survive."""
    run_dir = Path(plan["trainer_args"]["output_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    scripts = {"launch.sh": plan["launch_script"], "job.sbatch": plan["sbatch_script"]}
    for name, text in scripts.items():
        assert text, f"{name} was not rendered"
        path = work / name
        path.write_text(text)
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{name}: {syntax.stderr}\n{text}"
        out = work / f"{name}.argv"
        out.unlink(missing_ok=True)
        env = {
            "PATH": f"{stubs}:/usr/bin:/bin",
            "STUB_OUT": str(out),
            "SLURM_JOB_NODELIST": "node-a",
            "HOME": str(work),
        }
        proc = subprocess.run(
            ["bash", str(path)], env=env, cwd=work, capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 0, f"{name} exited {proc.returncode}: {proc.stderr}\n{text}"
        assert not marker.exists(), f"{name} ran a payload:\n{text}"
        calls = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(calls) == 1, calls
        argv = calls[0]
        assert argv[:2] == ["-m", "accelerate.commands.launch"] and "--spec" in argv, argv
        if name == "job.sbatch":
            # The plan's command is what each node runs: word for word, but for the node's own values.
            expected = plan["command"][1:]
            assert len(argv) == len(expected), (argv, expected)
            assert all(e.startswith("$") or a == e for a, e in zip(argv, expected, strict=True)), argv
            assert argv[argv.index("--spec") + 1] == plan["trainer_args"]["spec"]
        assert (run_dir / "exit_status").read_text().strip() == "0"
    for line in sbatch_directives(plan["sbatch_script"]):
        assert "touch" not in line and "wrap" not in line, line


def test_every_string_field_is_covered() -> None:
    fields = {".".join(map(str, p)) for p in string_fields(JobSpec.model_json_schema())}
    # The walk finds the fields that carry names and paths (a guard against a walk that finds nothing).
    for expected in (
        "name",
        "model.name_or_path",
        "dataset.name_or_path",
        "dataset.text_field",
        "lora.target_modules.0",
        "resources.slurm.partition",
        "resources.slurm.time_limit",
        "resume_from.job_id",
        "distributed.strategy",
    ):
        assert expected in fields, sorted(fields)


# Spec strings that are free text by design, not names or paths: they must be accepted as they are.
FREE_TEXT = ("eval", "sample_prompts")


def test_payload_in_every_string_field(server: Deployment, stubs: Path, marker: Path, tmp_path: Path) -> None:
    fields = string_fields(JobSpec.model_json_schema())
    cases: list[tuple[tuple[str | int, ...], str]] = [(f, p) for f in fields for p in payloads(marker)]
    # Local paths accept free text when the path exists: name the payload folders created above.
    for i, p in enumerate(payloads(marker)):
        cases.append((("model", "name_or_path"), f"./m/{p}"))
        cases.append((("dataset", "name_or_path"), f"./d/{p}/train{i}.jsonl"))
    accepted: list[dict[str, Any]] = []
    refused = 0
    with server.client(TOKENS["mallory"]) as c:
        for path, payload in cases:
            spec = slurm_spec()
            set_path(spec, path, payload)
            r = c.post("/jobs", params={"dry_run": "true"}, json=spec)
            assert r.status_code in (200, 422), (path, payload, r.status_code, r.text)
            if r.status_code == 422:
                refused += 1
                continue
            plan = r.json()
            accepted.append({"path": path, "payload": payload, "spec": spec})
            run_scripts(plan, tmp_path, stubs, marker)
    # Every named payload folder is accepted (newline ones are refused as paths), and so is every payload
    # as a sample prompt (text the model completes: data, which the scripts run above never execute);
    # everything else is 422.
    paths = 2 * sum("\n" not in p for p in payloads(marker))
    assert len(accepted) == paths + len(payloads(marker)), [(a["path"], a["payload"]) for a in accepted]
    assert all(a["path"][-1] == "name_or_path" or a["path"][:2] == FREE_TEXT for a in accepted)
    assert refused == len(cases) - len(accepted)
    assert not marker.exists()


def test_stored_job_keeps_the_payload_as_data(
    server: Deployment, stubs: Path, marker: Path, tmp_path: Path
) -> None:
    """A stored job: the spec returned holds the payload path verbatim; the stored plan runs clean."""
    p = payloads(marker)[0]
    spec = slurm_spec()
    spec["model"]["name_or_path"] = f"./m/{p}"
    spec["dataset"]["name_or_path"] = f"./d/{p}/train0.jsonl"
    with server.client(TOKENS["mallory"]) as c:
        r = c.post("/jobs", json=spec)
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["spec"]["model"]["name_or_path"].endswith(f"/m/{p}")
        plan = c.get(f"/jobs/{job['id']}/plan").json()
    assert job["id"] in plan["trainer_args"]["output_dir"]
    run_scripts(plan, tmp_path, stubs, marker)


# Real launches -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_launch_of_payload_specs(shared_up: Deployment, server: Deployment, marker: Path) -> None:
    """`ftq up` launches payload specs for real (local launcher, real accelerate and trainer).

    They fail when the trainer loads the empty weights; what matters is that no payload ran.
    """
    up = shared_up
    ps = payloads(marker)
    ids = []
    with up.client(TOKENS["mallory"]) as c:
        # One real launch carrying two payloads (model folder, dataset file): launches are slow here.
        for model_i, data_i in ((0, 3),):
            spec = slurm_spec()
            spec["resources"]["launcher"] = "local"
            spec["model"]["name_or_path"] = f"./m/{ps[model_i]}"
            spec["dataset"]["name_or_path"] = f"./d/{ps[data_i]}/train{data_i}.jsonl"
            r = c.post("/jobs", json=spec)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        deadline = time.monotonic() + 240
        jobs: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            jobs = {i: c.get(f"/jobs/{i}").json() for i in ids}
            if all(j["status"] in ("succeeded", "failed", "cancelled") for j in jobs.values()):
                break
            time.sleep(1)
        else:
            states = [j["status"] for j in jobs.values()]
            raise AssertionError(f"jobs did not end: {states}\n{up.log()[-3000:]}")
    for job_id, job in jobs.items():
        assert job["status"] == "failed", job
        run = up.data_dir / "runs" / job_id
        log = (run / "train.log").read_text(errors="replace")
        # It got as far as the trainer, which read the payload paths from spec.json as data.
        assert (run / "spec.json").exists() and (run / "exit_status").exists(), log[-2000:]
        saved = json.loads((run / "spec.json").read_text())
        assert saved["model"]["name_or_path"] == job["spec"]["model"]["name_or_path"]
        # The trainer failed on the model folder it was named, the payload path read verbatim as data.
        assert job["error"]["code"] == "model_error", (job["error"], log[-2000:])
        assert saved["model"]["name_or_path"] in job["error"]["message"], job["error"]
    assert not marker.exists()
    assert not any(Path(os.sep, "tmp").glob("pwned*"))
