"""A call's way to its engine and back: the model resolved for the owner, the engine acquired (started
and the adapter loaded where needed), the request forwarded with only the validated parameters, and the
answer passed back as the engine sends it: JSON, or server-sent events relayed line by line.

The engine's `usage` is counted per owner (Lease.record). A stream asks the engine for its usage chunk
(`stream_options.include_usage`) whatever the caller asked; a caller that did not ask for it does not get
it. The answer's `model` is the name the caller used: an adapter is loaded under that name, and a base
called by another alias than its engine's has the name put back."""

from __future__ import annotations

import json
import logging
import weakref
from asyncio import AbstractEventLoop, get_running_loop
from typing import Any

import anyio
import httpx
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from ftq.contract.serving import ChatCompletionCreate, CompletionCreate
from ftq.runtime.settings import Settings
from ftq.store.db import new_session
from service.errors import ServiceUnavailable
from service.openai.errors import OpenAIError, envelope
from service.serving import service
from service.serving.engines import EngineManager, Lease
from service.serving.service import Target

log = logging.getLogger(__name__)

# How long an engine may take to answer one call: a long generation on the CPU is slow, never this slow.
_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
_ERROR_BYTES = 64 * 1024  # of an engine's error answer, read to pass its message on


class Transport:
    """The HTTP clients that reach the engines: one per event loop (an httpx.AsyncClient belongs to the
    loop it was made on), on `transport` where one is given (tests)."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None):
        self._transport = transport
        self._clients: weakref.WeakKeyDictionary[AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> httpx.AsyncClient:
        loop = get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(transport=self._transport, timeout=_TIMEOUT, trust_env=False)
            self._clients[loop] = client
        return client


async def complete(
    manager: EngineManager,
    transport: Transport,
    owner: str,
    settings: Settings,
    body: ChatCompletionCreate | CompletionCreate,
    path: str,
) -> Response:
    """Answer `body` (POST /v1`path`) with the owner's engine for its model."""

    def resolve() -> Target:
        session = new_session()
        try:
            return service.resolve(session, owner, settings, body.model)
        finally:
            session.close()

    target = await anyio.to_thread.run_sync(resolve)
    lease = await manager.acquire(owner, target)
    try:
        payload = _payload(body, lease.engine_model)
        client = transport.client()
        request = client.build_request("POST", lease.base_url + path, json=payload, headers=lease.headers)
        try:
            upstream = await client.send(request, stream=body.stream)
        except httpx.TransportError as exc:
            lease.broken(f"{path}: {exc!r}")
            raise ServiceUnavailable(f"the engine for {target.label} stopped answering; retry") from None
        if upstream.status_code >= 400:
            return await _error(upstream, lease)
        if body.stream:
            wants_usage = bool(body.stream_options and body.stream_options.include_usage)
            relay = _Relay(upstream, lease, body.model, wants_usage)
            lease = None  # type: ignore[assignment]  # the relay releases it when the stream ends
            return relay
        try:
            content = await upstream.aread()
        except httpx.TransportError as exc:
            lease.broken(f"{path}: {exc!r}")
            raise ServiceUnavailable(f"the engine for {target.label} stopped answering; retry") from None
        return Response(_answer(content, lease, body.model), media_type="application/json")
    finally:
        if lease is not None:
            await lease.finish()


def _payload(body: BaseModel, engine_model: str) -> dict[str, Any]:
    """The engine's request: the validated parameters, none of them unset, the engine's name for the
    model, and a stream's usage always asked for (see the module's docstring)."""
    payload = body.model_dump(mode="json", exclude_none=True, exclude={"user", "stream_options"})
    payload["model"] = engine_model
    if payload.get("stream"):
        payload["stream_options"] = {"include_usage": True}
    return payload


def _count(lease: Lease, usage: Any) -> None:
    if isinstance(usage, dict):
        lease.record(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def _answer(content: bytes, lease: Lease, called: str) -> bytes:
    """A whole answer: its usage counted, passed on as it is unless its `model` needs the called name."""
    try:
        data = json.loads(content)
    except ValueError:
        return content
    if not isinstance(data, dict):
        return content
    _count(lease, data.get("usage"))
    if data.get("model", called) == called:
        return content
    data["model"] = called
    return json.dumps(data).encode()


async def _error(upstream: httpx.Response, lease: Lease) -> Response:
    """The engine's refusal in OpenAI's envelope: its status, message and param (vLLM's own body has them,
    with a numeric code that is no OpenAI code)."""
    try:
        raw = b""
        async for chunk in upstream.aiter_bytes():
            raw += chunk
            if len(raw) > _ERROR_BYTES:
                break
    finally:
        await upstream.aclose()
    status = upstream.status_code
    message, param = f"the engine refused the request ({status})", None
    try:
        error = json.loads(raw).get("error")
        if isinstance(error, dict):
            message = str(error.get("message") or message)
            param = error.get("param") if isinstance(error.get("param"), str) else None
    except (ValueError, AttributeError):
        pass
    if status == 404 and lease.target.adapter is not None:
        # The engine lost the adapter (restarted underneath?): loaded again on the next call.
        lease.adapter_gone()
        raise ServiceUnavailable(f"{lease.target.name} is being loaded again; retry")
    if status >= 500:
        log.error("engine error %s for %s: %s", status, lease.target.name, message)
        raise OpenAIError("the engine failed to answer; retry", code="engine_error", status=503)
    return envelope(status if status in (400, 404, 413, 422) else 400, message, param=param)


class _Relay(StreamingResponse):
    """The engine's server-sent events, relayed line by line as they come; the usage chunk counted (and
    left out where the caller did not ask for it); the lease released and the engine's stream closed
    however the relay ends (all sent, the caller gone, an error)."""

    def __init__(self, upstream: httpx.Response, lease: Lease, called: str, wants_usage: bool):
        self._upstream = upstream
        self._lease = lease
        self._called = called
        self._wants_usage = wants_usage
        super().__init__(
            self._lines(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _lines(self) -> Any:
        skip_blank = False
        try:
            async for line in self._upstream.aiter_lines():
                if skip_blank and line == "":
                    skip_blank = False
                    continue
                skip_blank = False
                if line.startswith("data: {"):
                    line, keep = self._event(line)
                    if not keep:
                        skip_blank = True
                        continue
                yield (line + "\n").encode()
        except httpx.TransportError as exc:
            # The engine died mid-stream: the caller's stream ends without [DONE]; the engine is forgotten.
            self._lease.broken(f"stream: {exc!r}")

    def _event(self, line: str) -> tuple[str, bool]:
        """(the line to send, whether to send it) for one `data: {...}` event."""
        has_usage = '"usage"' in line
        renamed = f'"model":"{self._called}"' not in line and '"model"' in line
        if not has_usage and not renamed:
            return line, True
        try:
            data = json.loads(line[len("data: ") :])
        except ValueError:
            return line, True
        if not isinstance(data, dict):
            return line, True
        usage = data.get("usage")
        if usage and not data.get("choices"):
            _count(self._lease, usage)
            if not self._wants_usage:
                return line, False
        if renamed and "model" in data and data["model"] != self._called:
            data["model"] = self._called
            return "data: " + json.dumps(data, separators=(",", ":")), True
        return line, True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._upstream.aclose()
            finally:
                await self._lease.finish()
