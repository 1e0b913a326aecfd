"""A job's events and the webhooks that deliver them: the names every process agrees on, the Standard
Webhooks signature, the retry schedule and the check of a receiver's address (SSRF).

Events are written by the store in the same transaction as the change they describe
(`ftq.store.events`); the worker's sender (`worker.webhooks`) delivers them; the API serves them. This
module does no I/O except `check_url`'s name lookup.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import random
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit


class EventType(StrEnum):
    created = "job.created"
    queued = "job.queued"  # data: position (1 = next to start)
    started = "job.started"  # data: launcher, host, external_id (the SLURM job id), pid, num_nodes
    checkpoint = "job.checkpoint"  # data: step, path (relative to the run directory)
    eval = "job.eval"  # data: step, metrics {eval_loss, ...}
    sample = "job.sample"  # data: step, prompt, completion (and reward: a GRPO rollout's)
    # data: evaluation_id, checkpoint ("final" or the step), step, status, metrics, best_checkpoint
    evaluation = "job.evaluation"
    # data: kind (nan_loss | loss_exploding | loss_spike | straggler | tracker_unreachable), step, message
    warning = "job.warning"
    retried = "job.retried"  # data: attempt, reason
    paused = "job.paused"  # data: step (the last step trained), checkpoint (its step; null: none saved)
    resumed = "job.resumed"  # data: checkpoint (the step its next run continues from; null: from the start)
    succeeded = "job.succeeded"
    failed = "job.failed"  # data: error {code, message, exit_code}
    cancelled = "job.cancelled"


EVENT_TYPES: tuple[str, ...] = tuple(t.value for t in EventType)

# The job's status when an event of each type is written (what a webhook's `data.job.status` says).
STATUS_AT = {
    EventType.created: "queued",
    EventType.queued: "queued",
    EventType.retried: "queued",
    EventType.paused: "paused",
    EventType.resumed: "queued",
    EventType.succeeded: "succeeded",
    EventType.failed: "failed",
    EventType.cancelled: "cancelled",
}


def status_at(type_: str) -> str:
    """`running` for what happens during a run (started, checkpoint, eval, sample, warning)."""
    try:
        return STATUS_AT.get(EventType(type_), "running")
    except ValueError:
        return "running"


# Webhook secrets: `whsec_` and the base64 of this many random bytes (Standard Webhooks' form).
SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
SECRET_BYTES = 24


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def message_id(event_id: int) -> str:
    """The `webhook-id` of an event's deliveries: the same on every retry and for every endpoint, and
    ordered as the events are (the number is the event's id)."""
    return f"evt_{event_id}"


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, keyed with the
    base64-decoded part of the secret after `whsec_` (Standard Webhooks)."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


# Retries --------------------------------------------------------------------------------------------------


def retry_delay(
    attempts: int, *, base: float, cap: float, jitter: float = 0.2, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before the next try after `attempts` failed ones: `base * 2**(attempts-1)`, at most `cap`,
    scaled by a random factor in [1 - jitter, 1 + jitter] so that endpoints that failed together do not
    retry together."""
    delay = min(cap, base * float(2 ** max(0, attempts - 1)))
    return max(0.0, float(delay * (1 - jitter + 2 * jitter * rand())))


def retry_schedule(*, base: float, cap: float, total: float) -> list[float]:
    """The delays (without jitter) a delivery that always fails gets before it gives up after `total`."""
    out: list[float] = []
    elapsed = 0.0
    attempts = 1
    while True:
        delay = retry_delay(attempts, base=base, cap=cap, jitter=0.0)
        if elapsed + delay > total:
            return out
        out.append(delay)
        elapsed += delay
        attempts += 1


# The receiver's address (SSRF) ------------------------------------------------------------------------------


class UnsafeURL(ValueError):
    """A webhook URL this server will not send to; the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked URL: its parts, and the addresses its host resolved to (every one allowed)."""

    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


def _networks(allowlist: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for part in allowlist.replace(";", ",").split(","):
        part = part.strip()
        if part:
            nets.append(ipaddress.ip_network(part, strict=False))
    return nets


# NAT64's well-known prefix (RFC 6052): the last 32 bits are the IPv4 address the gateway connects to.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Local-use NAT64 (RFC 8215): whatever the operator's translator maps it to; never a public receiver.
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches through a translator or tunnel: IPv4-mapped
    (`::ffff:a.b.c.d`), 6to4 (`2002:AABB:CCDD::/48`), NAT64 (`64:ff9b::a.b.c.d`), Teredo's client."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def address_refusal(
    address: str, *, development: bool, allowlist: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]
) -> str | None:
    """Why `address` may not receive webhooks, or None when it may.

    The operator's allowlist wins; then development allows loopback; everything else must be a global
    address (`ipaddress`'s `is_global`: not private, loopback, link-local (cloud metadata), shared/CGNAT
    `100.64.0.0/10` (which holds another cloud's metadata address), documentation, benchmarking...),
    neither multicast nor reserved, and so must the IPv4 address an IPv6 form of it reaches (IPv4-mapped,
    6to4 `2002::/16`, NAT64 `64:ff9b::/96`, Teredo): `2002:a9fe:a9fe::` is 169.254.169.254.
    """
    ip = ipaddress.ip_address(address)
    inner = embedded_ipv4(ip)
    if any(ip in net for net in allowlist) or (inner is not None and any(inner in net for net in allowlist)):
        return None
    # An address that embeds an IPv4 one is judged by where it leads (its own prefix is the tunnel's).
    target = inner if inner is not None else ip
    if target.is_loopback:
        return None if development else "a loopback address"
    if target.is_link_local:
        return "a link-local address"
    if target.is_multicast or target.is_reserved or target.is_unspecified:
        return "a reserved address"
    if target.is_private:
        return "a private address"
    if not target.is_global or ip in _NAT64_LOCAL:
        return "an address that is not public"
    return None


Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def check_url(url: str, *, development: bool, allowlist: str = "", resolver: Resolver = resolve) -> Target:
    """The checked target of a webhook URL, or UnsafeURL: http or https only, no credentials in it, and
    every address its host resolves to allowed (`address_refusal`). Called when the webhook is created
    and again before every send, since the name may resolve elsewhere by then (DNS rebinding)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL(f"not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UnsafeURL("the URL must start with http:// or https://")
    if parts.username or parts.password:
        raise UnsafeURL("the URL must not hold a user name or password")
    host = parts.hostname
    if not host:
        raise UnsafeURL("the URL has no host")
    port = port or (443 if scheme == "https" else 80)
    try:
        nets = _networks(allowlist)
    except ValueError as exc:
        raise UnsafeURL(f"FTQ_WEBHOOK_ALLOWED_NETWORKS is not a list of networks: {exc}") from None
    try:
        addresses = [str(ipaddress.ip_address(host))]  # an address written in the URL: no lookup
    except ValueError:
        addresses = []
    try:
        addresses = addresses or resolver(host, port)
    except (OSError, UnicodeError) as exc:
        raise UnsafeURL(f"the host {host} does not resolve: {exc}") from None
    if not addresses:
        raise UnsafeURL(f"the host {host} does not resolve")
    for address in addresses:
        why = address_refusal(address, development=development, allowlist=nets)
        if why is not None:
            hint = "" if development else " (an operator may allow it with FTQ_WEBHOOK_ALLOWED_NETWORKS)"
            # The address itself is not echoed: a tenant learns nothing of what an internal name
            # resolves to beyond that it is refused.
            shown = f"{host} is" if host == address else f"{host} resolves to"
            raise UnsafeURL(f"{shown} {why}; webhooks are not sent there{hint}")
    return Target(scheme=scheme, host=host, port=port, addresses=tuple(addresses))
