"""The HTTP/1.1 protocol `ftq api` serves with: uvicorn's, with the request head bounded while it is read.

uvicorn's httptools protocol buffers a request head of any size (a 20 MB header, 100 000 headers were
answered 200) before the app can look at it. This one stops reading a head over FTQ_MAX_HEADER_BYTES or
FTQ_MAX_HEADER_COUNT and answers 431. Without httptools, uvicorn's h11 protocol is used with its
`h11_max_incomplete_event_size` set to the same byte limit (and the app's `RequestGuard` counts).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

_CRLF2 = b"\r\n\r\n"


def _response(status_line: bytes, code: str, message: str) -> bytes:
    body = json.dumps({"detail": message, "code": code}).encode()
    return b"".join(
        [
            status_line,
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def bounded_http_protocol(max_header_bytes: int, max_header_count: int) -> type[asyncio.Protocol] | None:
    """A protocol class for `uvicorn.run(http=...)`, or None where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:
        return None

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = True  # reading a request line and headers (not a body)
            self._head_bytes = 0
            self._tail = b""  # the last bytes seen, to find a head's end split across reads
            self._too_large: str | None = None

        def _refuse(self, message: str) -> None:
            self.transport.write(_response(STATUS_LINE[431], "headers_too_large", message))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                seen = self._tail + data
                end = seen.find(_CRLF2)
                self._head_bytes += len(data) if end < 0 else max(0, end + len(_CRLF2) - len(self._tail))
                self._tail = seen[-3:]
                if self._head_bytes > max_header_bytes:
                    self._refuse(f"the request line and headers are over {max_header_bytes} bytes")
                    return
            super().data_received(data)

        def send_400_response(self, msg: str) -> None:
            # The parser's callbacks can only fail the parse; a refusal of ours becomes a 431 here.
            if self._too_large is not None:
                self._refuse(self._too_large)
                return
            super().send_400_response(msg)

        def on_header(self, name: bytes, value: bytes) -> None:
            if len(self.headers) >= max_header_count:
                self._too_large = f"more than {max_header_count} request headers"
                raise ValueError(self._too_large)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes, self._tail = True, 0, b""

    return BoundedHttpToolsProtocol


def __getattr__(name: str) -> Any:
    """`ftq.runtime.http_protocol:FromSettings`: the bounded protocol for this process's settings, by import
    string,
    which is how `uvicorn.run(workers=N)` hands a protocol class to its worker processes (a class made at
    run time cannot be pickled to them)."""
    if name == "FromSettings":
        from ftq.runtime.settings import get_settings

        settings = get_settings()
        cls = bounded_http_protocol(settings.max_header_bytes, settings.max_header_count)
        if cls is None:
            from uvicorn.protocols.http.h11_impl import H11Protocol

            return H11Protocol
        return cls
    raise AttributeError(name)
