"""Every request the service makes to a server it does not run (webhook receivers, trackers'
reachability checks, ...) goes through `request`: ONE total deadline for the whole request.

httpx's timeouts bound each socket operation (connect, one read, one write), not the request: a server
that answers `HTTP/1.1 200 OK\\r\\nX-A: ` and then one byte every 3 s never trips a 5 s read timeout and
holds the caller forever. Here every socket operation's timeout is cut to what is left of the request's
deadline (connect, TLS handshake, sending, the status line, the headers and whatever of the body is
read), so the call returns or raises `OutboundError` by the deadline (plus the last operation's
rounding), however the peer trickles. Name resolution happens before the deadline starts: callers that
must bound it (webhooks) connect to an address they resolved and checked themselves.

Redirects are never followed and the environment's proxies are not used (`trust_env=False`).
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

USER_AGENT = "ftq/1"


class OutboundError(Exception):
    """The request got no answer: no connection, a broken one, or the deadline passed."""


@dataclass(frozen=True)
class Answer:
    status_code: int
    headers: httpx.Headers
    body: bytes
    """At most `read_body` bytes of the answer's body (none by default)."""


def _left(deadline: float, timeout: float | None) -> float:
    """The socket timeout for one operation: its own, cut to what is left of the deadline."""
    left = deadline - time.monotonic()
    return max(0.0, min(left, math.inf if timeout is None else timeout))


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        left = _left(self._deadline, timeout)
        if left <= 0:
            raise httpcore.ReadTimeout("the request's deadline passed")
        return self._inner.read(max_bytes, left)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        left = _left(self._deadline, timeout)
        if left <= 0:
            raise httpcore.WriteTimeout("the request's deadline passed")
        self._inner.write(buffer, left)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout)
        if left <= 0:
            raise httpcore.ConnectTimeout("the request's deadline passed")
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, left), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, deadline: float) -> None:
        self._inner = httpcore.SyncBackend()
        self._deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout)
        if left <= 0:
            raise httpcore.ConnectTimeout("the request's deadline passed")
        stream = self._inner.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("outbound requests go over TCP only")

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, max(0.0, self._deadline - time.monotonic())))


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport on a connection pool whose sockets never outlive `deadline`."""

    def __init__(self, deadline: float, verify: bool | ssl.SSLContext) -> None:
        super().__init__(verify=verify, trust_env=False, retries=0)
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify=verify)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=1,
            max_keepalive_connections=0,
            network_backend=_DeadlineBackend(deadline),
        )


def request(
    method: str,
    url: str | httpx.URL,
    *,
    deadline_seconds: float,
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    read_body: int = 0,
    verify: bool | ssl.SSLContext = True,
) -> Answer:
    """One request, over by `deadline_seconds` after the call (connect, send, headers and the first
    `read_body` bytes of the body together); `OutboundError` when there is no answer by then."""
    deadline = time.monotonic() + deadline_seconds
    all_headers = {"user-agent": USER_AGENT, **(headers or {})}
    per_operation = httpx.Timeout(deadline_seconds)
    try:
        with (
            httpx.Client(
                transport=_DeadlineTransport(deadline, verify),
                timeout=per_operation,
                follow_redirects=False,
                trust_env=False,
            ) as client,
            client.stream(method, url, headers=all_headers, content=content) as response,
        ):
            body = b""
            if read_body > 0:
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) >= read_body:
                        body = body[:read_body]
                        break
            return Answer(response.status_code, response.headers, body)
    except httpx.TimeoutException as exc:
        raise OutboundError(f"no answer within {deadline_seconds:g}s") from exc
    except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
        raise OutboundError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc
