"""ftq.contract.events: the Standard Webhooks signature, the retry schedule and the receiver address check
(SSRF)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from ftq.contract import events as ev


def reference_signature(secret: str, msg_id: str, timestamp: int, payload: bytes) -> str:
    """Standard Webhooks' algorithm, written from the specification: the key is the base64 after
    `whsec_`, the signed content `{id}.{timestamp}.{payload}`, the header `v1,<base64 of the MAC>`."""
    key = base64.b64decode(secret.split("_", 1)[1])
    content = msg_id.encode() + b"." + str(timestamp).encode() + b"." + payload
    return "v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()


def test_signature_matches_the_reference_algorithm() -> None:
    secret = ev.new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == ev.SECRET_BYTES
    body = b'{"type":"job.succeeded","data":{"job_id":"job_1"}}'
    got = ev.sign(secret, "evt_42", 1_700_000_000, body)
    assert got == reference_signature(secret, "evt_42", 1_700_000_000, body)
    # Any change to the id, the timestamp, the body or the key gives another signature.
    assert got != ev.sign(secret, "evt_43", 1_700_000_000, body)
    assert got != ev.sign(secret, "evt_42", 1_700_000_001, body)
    assert got != ev.sign(secret, "evt_42", 1_700_000_000, body + b" ")
    assert got != ev.sign(ev.new_secret(), "evt_42", 1_700_000_000, body)


def test_signature_of_the_specifications_example() -> None:
    # The example the Standard Webhooks reference libraries test against.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    payload = b'{"test": 2432232314}'
    want = reference_signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, payload)
    assert ev.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, payload) == want
    assert want == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_message_ids_order_as_the_events() -> None:
    assert ev.message_id(7) == "evt_7"
    ids = [ev.message_id(i) for i in (3, 12, 105)]
    assert [int(i.removeprefix("evt_")) for i in ids] == [3, 12, 105]


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    plain = [ev.retry_delay(n, base=5, cap=60, jitter=0) for n in range(1, 8)]
    assert plain == [5, 10, 20, 40, 60, 60, 60]
    low = ev.retry_delay(3, base=5, cap=60, jitter=0.2, rand=lambda: 0.0)
    high = ev.retry_delay(3, base=5, cap=60, jitter=0.2, rand=lambda: 0.999999)
    assert low == pytest.approx(16.0) and high == pytest.approx(24.0, rel=1e-4)


def test_retry_schedule_stays_within_the_total() -> None:
    schedule = ev.retry_schedule(base=5, cap=3600, total=86400)
    assert schedule[:4] == [5, 10, 20, 40]
    assert sum(schedule) <= 86400 and sum(schedule) + 3600 > 86400
    assert max(schedule) == 3600
    assert ev.retry_schedule(base=1, cap=4, total=10) == [1, 2, 4]


def resolver(table: dict[str, list[str]]) -> ev.Resolver:
    def look(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("Name or service not known")
        return table[host]

    return look


HOSTS = resolver(
    {
        "hooks.example.com": ["93.184.216.34"],
        "localhost": ["127.0.0.1", "::1"],
        "intranet": ["10.1.2.3"],
        "metadata": ["169.254.169.254"],
        "mixed": ["93.184.216.34", "192.168.1.5"],
        "mapped": ["::ffff:127.0.0.1"],
        "v6": ["2606:2800:220:1:248:1893:25c8:1946"],
    }
)


@pytest.mark.parametrize(
    ("url", "development", "allowlist", "refused"),
    [
        ("https://hooks.example.com/ftq", False, "", None),
        ("http://v6:8080/x", False, "", None),
        ("ftp://hooks.example.com/x", True, "", "http:// or https://"),
        ("file:///etc/passwd", True, "", "http:// or https://"),
        ("https://user:pw@hooks.example.com/", True, "", "user name or password"),
        ("http://localhost:9000/", False, "", "loopback"),
        ("http://127.0.0.1:9000/", False, "", "loopback"),
        ("http://[::1]:9000/", False, "", "loopback"),
        ("http://mapped/", False, "", "loopback"),
        ("http://localhost:9000/", True, "", None),
        ("http://127.0.0.1:9000/", True, "", None),
        ("http://intranet/", False, "", "private"),
        ("http://intranet/", True, "", "private"),
        ("http://intranet/", False, "10.0.0.0/8", None),
        ("http://127.0.0.1:9000/", False, "127.0.0.0/8", None),
        ("http://metadata/latest/", True, "", "link-local"),
        ("http://169.254.169.254/", True, "", "link-local"),
        ("http://mixed/", False, "", "private"),
        ("http://0.0.0.0:80/", True, "", "reserved"),
        ("http://nowhere.invalid/", True, "", "does not resolve"),
        # Issue 28, finding 7: addresses that are not global, in every form (CGNAT holds a cloud's
        # metadata address; 6to4, NAT64 and Teredo forms lead to the IPv4 address inside them).
        ("http://100.100.100.200/latest/meta-data", False, "", "not public"),
        ("http://100.64.0.1/", True, "", "not public"),
        ("http://[2002:a9fe:a9fe::]/", False, "", "link-local"),
        ("http://[2002:7f00:1::]/", False, "", "loopback"),
        ("http://[2002:a00:1::]/", True, "", "private"),
        ("http://[64:ff9b::a9fe:a9fe]/", False, "", "link-local"),
        ("http://[64:ff9b::6440:101]/", False, "", "not public"),
        ("http://[64:ff9b:1::a00:1]/", False, "", "reserved|not public"),
        ("http://[::ffff:100.100.100.200]/", False, "", "not public"),
        ("http://[::ffff:a9fe:a9fe]/", True, "", "link-local"),
        ("http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/", False, "", "private|reserved|not public"),
        ("http://192.0.2.10/", False, "", "private|not public"),
        ("http://[ff0e::1]/", False, "", "reserved"),
        ("http://[2002:5db8:d822::]/", False, "", None),
        ("http://[64:ff9b::5db8:d822]/", False, "", None),
        ("http://[2002:a9fe:a9fe::]/", False, "169.254.0.0/16", None),
        ("http:///nohost", True, "", "no host"),
        ("http://hooks.example.com:99999/", True, "", "not a valid URL"),
    ],
)
def test_url_check(url: str, development: bool, allowlist: str, refused: str | None) -> None:
    if refused is None:
        target = ev.check_url(url, development=development, allowlist=allowlist, resolver=HOSTS)
        assert target.addresses
        return
    with pytest.raises(ev.UnsafeURL, match=refused):
        ev.check_url(url, development=development, allowlist=allowlist, resolver=HOSTS)


def test_a_name_that_rebinds_is_refused_at_the_next_check() -> None:
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])
    rebinding: ev.Resolver = lambda host, port: next(answers)  # noqa: E731
    assert ev.check_url("http://rebind.example/", development=False, resolver=rebinding).addresses == (
        "93.184.216.34",
    )
    with pytest.raises(ev.UnsafeURL, match="loopback"):
        ev.check_url("http://rebind.example/", development=False, resolver=rebinding)


def test_a_bad_allowlist_is_named() -> None:
    with pytest.raises(ev.UnsafeURL, match="FTQ_WEBHOOK_ALLOWED_NETWORKS"):
        ev.check_url("http://127.0.0.1/", development=False, allowlist="not-a-net", resolver=HOSTS)


def test_pause_and_resume_are_event_types_webhooks_subscribe_to_with_their_status() -> None:
    assert {"job.paused", "job.resumed"} <= set(ev.EVENT_TYPES)
    assert ev.status_at("job.paused") == "paused" and ev.status_at("job.resumed") == "queued"
    assert ev.status_at("job.checkpoint") == "running"


def test_a_refusal_does_not_tell_what_an_internal_name_resolves_to() -> None:
    """Issue 28, finding 7: a tenant learns that an address is refused, not which address it is."""
    with pytest.raises(ev.UnsafeURL) as refused:
        ev.check_url("http://intranet/", development=False, resolver=HOSTS)
    assert "10.1.2.3" not in str(refused.value) and "private" in str(refused.value)
