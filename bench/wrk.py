"""Load generation for the benches: wrk runs against a server (closed loop, or paced like dashboards
polling), one client's sequential latency, and the server's CPU per request over a run."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit

from bench import OUT
from tests.harness import Deployment

# wrk's Lua hooks: `paths` is filled in per run; each thread picks paths at random and the summary is
# printed as one JSON line that `wrk_run` reads back.
_WRK_LUA = r"""
local paths = {%(paths)s}
local headers = {%(headers)s}
local think_ms = %(think_ms)d
function init(args)
  math.randomseed(os.time() + math.floor(os.clock() * 1000000))
end
request = function()
  local p = paths[math.random(#paths)]
  return wrk.format("GET", p, headers)
end
if think_ms > 0 then
  -- Each connection waits a random 0..2x think_ms before its next request: a dashboard's poll
  -- interval, without every client firing in step.
  delay = function()
    return math.random(0, 2 * think_ms)
  end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "max_us": %%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk_run(
    base: str,
    paths: list[str],
    *,
    connections: int,
    seconds: float,
    threads: int = 1,
    headers: dict[str, str] | None = None,
    think_ms: int = 0,
    timeout_s: float = 10.0,
) -> dict[str, float]:
    """Closed-loop load: `connections` clients each sending the next request as soon as one returns
    (or, with think_ms, after waiting a random 0..2*think_ms, like a dashboard's poll interval).

    Returns req_s, p50_ms, p90_ms, p99_ms, max_ms, errors (socket errors, timeouts and non-2xx/3xx).
    """
    OUT.mkdir(parents=True, exist_ok=True)
    script = OUT / f"wrk-{secrets.token_hex(4)}.lua"
    hdrs = ", ".join(f'["{k}"] = "{v}"' for k, v in (headers or {}).items())
    script.write_text(
        _WRK_LUA % {"paths": ", ".join(json.dumps(p) for p in paths), "headers": hdrs, "think_ms": think_ms}
    )
    try:
        proc = subprocess.run(
            [
                "wrk",
                "-t",
                str(threads),
                "-c",
                str(connections),
                "-d",
                f"{max(1, int(seconds))}s",
                "--timeout",
                f"{max(1, int(timeout_s))}s",
                "-s",
                str(script),
                base,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        script.unlink(missing_ok=True)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("WRKJSON "))
    raw = json.loads(line[len("WRKJSON ") :])
    errors = raw["connect"] + raw["read"] + raw["write"] + raw["status"] + raw["timeout"]
    return {
        "requests": raw["requests"],
        "req_s": raw["requests"] / (raw["duration_us"] / 1e6),
        "p50_ms": raw["p50_us"] / 1000,
        "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "errors": errors,
    }


def sequential_latency(
    url: str, *, n: int, headers: dict[str, str] | None = None, warm: int | None = None, timeout_s: float = 10
) -> dict[str, float]:
    """One client, one request at a time: the cost of a single request without queueing."""
    import httpx

    times: list[float] = []
    with httpx.Client(headers=headers, timeout=timeout_s) as client:
        for _ in range(max(5, n // 20) if warm is None else warm):  # warm the connection pool and caches
            client.get(url).raise_for_status()
        for _ in range(n):
            t = time.perf_counter()
            client.get(url).raise_for_status()
            times.append(time.perf_counter() - t)
    times.sort()
    return {
        "p50_ms": times[len(times) // 2] * 1000,
        "p99_ms": times[int(len(times) * 0.99)] * 1000,
        "mean_ms": sum(times) / len(times) * 1000,
    }


def measured(
    server: Deployment,
    paths: list[str],
    *,
    connections: int,
    seconds: float,
    think_ms: int = 0,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """wrk_run plus the server's CPU milliseconds per request over the same run."""
    before = server.cpu_seconds()
    out = wrk_run(
        server.url, paths, connections=connections, seconds=seconds, think_ms=think_ms, headers=headers
    )
    out["cpu_ms"] = (server.cpu_seconds() - before) * 1000 / max(1, out["requests"])
    return out


def interleaved(
    server: Deployment, loads: dict[str, list[str]], *, connections: int, seconds: float, rounds: int = 3
) -> dict[str, dict[str, float]]:
    """Each load in turn, `rounds` times, `seconds` in all per load: on a shared machine, a burst of
    someone else's work then hits every load alike. Latency percentiles are the worst round's."""
    total: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for name, paths in loads.items():
            r = measured(server, paths, connections=connections, seconds=seconds / rounds)
            t = total.setdefault(
                name, {"requests": 0, "seconds": 0.0, "cpu": 0.0, "errors": 0, "p50_ms": 0.0, "p99_ms": 0.0}
            )
            t["requests"] += r["requests"]
            t["seconds"] += r["requests"] / r["req_s"] if r["req_s"] else seconds / rounds
            t["cpu"] += r["cpu_ms"] * r["requests"]
            t["errors"] += r["errors"]
            t["p50_ms"] = max(t["p50_ms"], r["p50_ms"])
            t["p99_ms"] = max(t["p99_ms"], r["p99_ms"])
    for t in total.values():
        t["req_s"] = t["requests"] / t["seconds"]
        t["cpu_ms"] = t["cpu"] / max(1, t["requests"])
    return total


_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)")


def _keep_alive_client(
    host: str, port: int, paths: list[str], start: int, stop: threading.Event, tally: list[int]
) -> None:
    """One connection sending `paths` in turn (from `start`), each after the last answer: tally gets
    [requests, errors]. Plain sockets, so the client's CPU per request is a fraction of the server's."""
    requests = [f"GET {p} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode() for p in paths]
    with socket.create_connection((host, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        k = start
        while not stop.is_set():
            sock.sendall(requests[k % len(requests)])
            k += 1
            while b"\r\n\r\n" not in buf:
                buf += sock.recv(65536)
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = _CONTENT_LENGTH.search(head)
            size = int(length.group(1)) if length else 0
            while len(buf) < size:
                buf += sock.recv(65536)
            buf = buf[size:]
            tally[0] += 1
            if not head.startswith(b"HTTP/1.1 200"):
                tally[1] += 1


def threads_load(base: str, paths: list[str], *, threads: int, seconds: float) -> dict[str, float]:
    """`threads` client threads, one keep-alive connection each, sending back to back for `seconds`
    (closed loop, like wrk; for a server whose figure is quoted in client threads). Returns req_s and
    errors (answers other than 200)."""
    url = urlsplit(base)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    stop = threading.Event()
    tallies = [[0, 0] for _ in range(threads)]
    workers = [
        threading.Thread(
            target=_keep_alive_client, args=(host, port, paths, i, stop, tallies[i]), daemon=True
        )
        for i in range(threads)
    ]
    start = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join(timeout=30)
    elapsed = time.perf_counter() - start
    return {"req_s": sum(t[0] for t in tallies) / elapsed, "errors": sum(t[1] for t in tallies)}
