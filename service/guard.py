"""Checks every request passes before any route sees it: header limits, the Host, and the origin.

- Header count and size over FTQ_MAX_HEADER_COUNT / FTQ_MAX_HEADER_BYTES: 431. (`ftq api` also stops a
  longer head while it is read, in `ftq.runtime.http_protocol`; this covers any other server.)
- Host: with auth off (or FTQ_ALLOWED_HOSTS set) the Host header must name this server: the loopback
  names, FTQ_HOST, FTQ_ALLOWED_HOSTS, or the address the request came in on. Anything else is a 421, so
  a page on attacker.example whose name was rebound to 127.0.0.1 is not served.
- With auth off, the browser is the only credential: a state-changing request (not GET, HEAD or
  OPTIONS) that a browser marks as coming from another site (`Sec-Fetch-Site`), or whose `Origin` is
  not this server's, is a 403. Clients that send neither header (curl, the CLI, the SDK) are unaffected;
  the dashboard's own requests are same-origin.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from ftq.runtime.settings import Settings
from service.errors import Forbidden, FtqError, HeadersTooLarge, MisdirectedRequest
from service.openai import errors as openai_errors

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


async def send_error(send: Send, err: FtqError, path: str = "") -> None:
    """The error as a response from middleware; under `/v1`, in OpenAI's envelope."""
    body = json.dumps(openai_errors.body_of(err) if openai_errors.under_v1(path) else err.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": err.status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in err.headers.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def host_name(host: str) -> str:
    """The name in a Host header value, without its port: `[::1]:8000` -> `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host.rstrip(".")


def _authority(netloc: str, scheme: str) -> str:
    netloc = netloc.strip().lower()
    default = _DEFAULT_PORTS.get(scheme)
    if default and netloc.endswith(f":{default}"):
        netloc = netloc[: -len(default) - 1]
    return netloc


def same_origin(origin: str, host: str) -> bool:
    """Whether an Origin header names the server the Host header names (scheme-default ports aside)."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False  # `null` (sandboxed pages, file://) and anything odd
    return _authority(parts.netloc, parts.scheme) == _authority(host, parts.scheme)


class RequestGuard:
    """The checks above, as ASGI middleware outside every route (and outside the body-size cap)."""

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.max_header_count = settings.max_header_count
        self.max_header_bytes = settings.max_header_bytes
        self.allowed_hosts = settings.allowed_host_names
        self.check_origin = not settings.auth_enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        err = self.refusal(scope)
        if err is not None:
            await send_error(send, err, scope.get("path", ""))
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> FtqError | None:
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if len(headers) > self.max_header_count:
            return HeadersTooLarge(f"more than {self.max_header_count} request headers")
        if sum(len(k) + len(v) + 4 for k, v in headers) > self.max_header_bytes:
            return HeadersTooLarge(f"the request headers are over {self.max_header_bytes} bytes")
        found: dict[bytes, str] = {}
        for k, v in headers:
            if k in (b"host", b"origin", b"sec-fetch-site") and k not in found:
                found[k] = v.decode("latin-1")
        host = found.get(b"host")
        if self.allowed_hosts is not None and host is not None:
            name = host_name(host)
            server = scope.get("server")
            own = host_name(str(server[0])) if server else None
            if name not in self.allowed_hosts and name != own:
                return MisdirectedRequest(
                    f"this server does not answer for host {name[:100]!r}; add it to FTQ_ALLOWED_HOSTS"
                )
        if self.check_origin and scope.get("method", "GET") not in SAFE_METHODS:
            site = found.get(b"sec-fetch-site", "").strip().lower()
            if site and site not in ("same-origin", "none"):
                return Forbidden("cross-site requests cannot change anything on this server")
            origin = found.get(b"origin")
            if origin is not None and (host is None or not same_origin(origin, host)):
                return Forbidden("cross-origin requests cannot change anything on this server")
        return None
