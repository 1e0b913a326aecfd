"""The Python SDK (`ftq.client`) against real servers, nothing mocked.

Jobs that train run on the session's shared `ftq up` (the e2e session fixture `server`); one of them is
read through both `Client` and `AsyncClient` (`sdk_client`). Paging, owners and the error types use a private
`ftq api` that this module starts with two tokens and no worker, so its jobs stay queued and cost no CPU,
and its job list holds only what these tests put there.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from ftq.client import (
    ApiError,
    AsyncClient,
    Client,
    ConnectionFailed,
    DeploymentList,
    FtqAPIError,
    InvalidURL,
    JobPublic,
    JobSpec,
    JobStatus,
    NotFound,
    PlanPublic,
    RateLimited,
    SpecFileError,
    Unauthorized,
    ValidationError,
    WaitTimeout,
)
from tests.harness import (
    EXAMPLES,
    SDK_STYLES,
    Deployment,
    example_spec,
    free_port,
    one_process_example,
    run_ftq,
    sdk_client,
)

TINY_SPEC = EXAMPLES / "tiny-cpu.yaml"
ERIN_TOKEN = "e2e-sdk-erin-token"
FRANK_TOKEN = "e2e-sdk-frank-token"
UNKNOWN_ID = "job_0000000000000000"


class CountingTransport(httpx.HTTPTransport):
    """The real HTTP transport, recording each request's path (what `transport=` is for)."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


@pytest.fixture(scope="module")
def api_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """`ftq api` without a worker on a free port and its own data dir: erin and frank have tokens."""
    tokens = {"erin": ERIN_TOKEN, "frank": FRANK_TOKEN}
    with Deployment(tmp_path_factory.mktemp("sdk-api"), mode="api", tokens=tokens) as dep:
        yield dep


@pytest.fixture
def erin(api_only: Deployment) -> Iterator[Client]:
    with Client(api_only.url, ERIN_TOKEN) as client:
        yield client


def _wait_for(client: Client, job_id: str, status: str, timeout: float) -> JobPublic:
    deadline = time.monotonic() + timeout
    while True:
        job = client.jobs.get(job_id)
        if job.status == status or job.status in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"{job_id} still {job.status}"
        time.sleep(0.3)


# On the shared `ftq up`: real training runs -----------------------------------------------------------


@pytest.fixture(scope="module")
def sdk_job(server: Deployment) -> JobPublic:
    """One tiny training job that both clients read, created by AsyncClient as it is queued: the
    synchronous client is generated from the async one (bin/unasync_sdk.py), and its create is the
    idempotency test's."""
    with sdk_client("async", server.url, token="") as ftq:
        job = ftq.jobs.create(one_process_example(max_steps=8, eval_steps=4, save_steps=4))
    assert isinstance(job, JobPublic)
    assert job.status in (JobStatus.queued, JobStatus.starting, JobStatus.running)
    assert job.spec.training.max_steps == 8 and job.owner == "local"
    return job


@pytest.mark.slow  # a real tiny training run
@pytest.mark.parametrize("style", SDK_STYLES)
def test_create_follow_logs_metrics_and_wait(server: Deployment, sdk_job: JobPublic, style: str) -> None:
    # The first style follows the job while it trains; the second reads it once it has ended.
    job = sdk_job
    with sdk_client(style, server.url, token="") as ftq:
        assert ftq.health().status == "ok"
        got = ftq.jobs.get(job.id)
        assert isinstance(got, JobPublic) and got.id == job.id and got.spec.training.max_steps == 8

        # follow=True returns once the job has ended and its whole log was read.
        lines = list(ftq.jobs.logs(job.id, follow=True))
        final = ftq.jobs.wait(job.id, timeout=300)
        assert final.status == JobStatus.succeeded, "\n".join(lines[-30:])
        assert any("trained to step 8" in line for line in lines), lines[-20:]
        whole = ftq.jobs.log_chunk(job.id, limit=1_048_576)
        assert whole.complete
        assert lines == whole.text.removesuffix("\n").split("\n")  # every line, in order, once

        points = list(ftq.jobs.iter_metrics(job.id))
        losses = [p for p in points if p.loss is not None]
        assert [p.step for p in losses] == list(range(1, 9))
        assert all(p.loss is not None and math.isfinite(p.loss) for p in losses)
        assert any(p.eval_loss is not None for p in points)
        page = ftq.jobs.metrics(job.id, after_step=4, limit=2)
        assert [p.step for p in page.data] == [5, 6] and page.next_after_step == 6
        assert not page.complete  # more points follow step 6
        assert final.latest_metrics is not None and final.progress.step == 8

        plan = ftq.jobs.plan(job.id)
        assert "trainer" in plan.command and plan.sbatch_script is None
        assert job.id in plan.launch_script
        steps = [c.step for c in ftq.jobs.checkpoints(job.id)]
        assert {4, 8} <= set(steps), steps

        assert ftq.jobs.cancel(job.id).status == JobStatus.succeeded  # a finished job stays as it is
        assert job.id in {j.id for j in ftq.jobs.list(status="succeeded")}
        assert job.id in {j.id for j in ftq.jobs.list(status=[JobStatus.succeeded], limit=1)}  # page by page
        with pytest.raises(NotFound):
            ftq.jobs.get(UNKNOWN_ID)


@pytest.mark.slow  # a real launch, cancelled while it trains
def test_idempotent_create_then_cancel_a_running_job(server: Deployment) -> None:
    spec = one_process_example(max_steps=100_000)
    key = f"sdk-{uuid.uuid4().hex}"
    with Client(server.url, token="") as ftq:
        first = ftq.jobs.create(spec, idempotency_key=key)
        again = ftq.jobs.create(spec, idempotency_key=key)
        assert again.id == first.id  # the retry is the same job, not a second one

        with pytest.raises(ValidationError) as other_body:
            ftq.jobs.create(one_process_example(max_steps=99_999), idempotency_key=key)
        assert other_body.value.loc == ["header", "Idempotency-Key"]

        running = _wait_for(ftq, first.id, "running", timeout=180)
        assert running.status == JobStatus.running, running.error
        with pytest.raises(WaitTimeout) as timed_out:
            ftq.jobs.wait(first.id, timeout=0.5, poll=0.1)
        assert timed_out.value.job.status == JobStatus.running

        assert ftq.jobs.cancel(first.id).status in (JobStatus.cancelling, JobStatus.cancelled)
        final = ftq.jobs.wait(first.id, timeout=120, poll=0.5)
        assert final.status == JobStatus.cancelled
        assert final.error is None


# On a private `ftq api`: plans, paging, owners and errors -----------------------------------------------


def test_async_client_follows_a_log_while_another_call_waits(api_only: Deployment) -> None:
    async def run() -> None:
        async with AsyncClient(api_only.url, ERIN_TOKEN) as ftq:
            job = await ftq.jobs.create(example_spec())

            async def cancel_after_a_wait() -> JobPublic:
                with pytest.raises(WaitTimeout):  # no worker: it stays queued while its log is followed
                    await ftq.jobs.wait(job.id, timeout=0.5, poll=0.1)
                return await ftq.jobs.cancel(job.id)

            # Two calls on one client at once: the log stream stays open while the other waits, and
            # ends once the job does.
            lines, cancelled = await asyncio.gather(
                _collect(ftq.jobs.logs(job.id, follow=True, poll=0.2)), cancel_after_a_wait()
            )
            assert cancelled.status == JobStatus.cancelled
            assert lines == []  # it never started: no train.log

    asyncio.run(run())


async def _collect(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


def test_dry_run_returns_the_plan_and_stores_nothing(erin: Client) -> None:
    before = [j.id for j in erin.jobs.list()]
    plan = erin.jobs.create(TINY_SPEC, dry_run=True)
    assert isinstance(plan, PlanPublic)
    assert plan.sbatch_script is None and "launch" in plan.launch_script
    assert plan.estimate is not None and plan.estimate.fits is True

    falcon = erin.jobs.create(str(EXAMPLES / "falcon-180b-lora-zero3.yaml"), dry_run=True)
    assert falcon.accelerate_config["distributed_type"] == "DEEPSPEED"
    assert falcon.sbatch_script is not None and "#SBATCH --nodes=2" in falcon.sbatch_script

    from_model = erin.jobs.create(JobSpec.model_validate(example_spec()), dry_run=True)
    assert from_model.command == plan.command
    assert [j.id for j in erin.jobs.list()] == before


def test_list_follows_next_cursor_across_pages(api_only: Deployment, erin: Client) -> None:
    created = [erin.jobs.create(example_spec(max_steps=10 + i)).id for i in range(5)]
    assert all(j.status == JobStatus.queued for j in (erin.jobs.get(i) for i in created))

    transport = CountingTransport()
    with Client(api_only.url, ERIN_TOKEN, transport=transport) as counted:
        listed = [j.id for j in counted.jobs.list(status="queued", limit=2)]
    everything = [j.id for j in erin.jobs.list_page("queued", limit=500).data]
    assert listed == everything  # every job once, newest first
    assert [i for i in listed if i in created] == created[::-1]
    assert transport.paths.count("/jobs") == math.ceil(len(everything) / 2) >= 3

    for job_id in created:
        assert erin.jobs.cancel(job_id).status == JobStatus.cancelled  # queued: at once
    cancelled = {j.id for j in erin.jobs.list(status=[JobStatus.cancelled, JobStatus.failed], limit=2)}
    assert set(created) <= cancelled
    assert not set(created) & {j.id for j in erin.jobs.list(status="queued")}


def test_typed_errors(api_only: Deployment, erin: Client, tmp_path: Path) -> None:
    with pytest.raises(NotFound) as missing:
        erin.jobs.get(UNKNOWN_ID)
    assert missing.value.status_code == 404 and missing.value.code == "not_found"
    assert isinstance(missing.value, ApiError) and missing.value.status == 404

    # Another owner's job does not exist for frank, on every route.
    job = erin.jobs.create(example_spec())
    with Client(api_only.url, FRANK_TOKEN) as frank:
        for call in (frank.jobs.get, frank.jobs.cancel, frank.jobs.plan, frank.jobs.metrics):
            with pytest.raises(NotFound):
                call(job.id)
        with pytest.raises(NotFound):
            list(frank.jobs.logs(job.id))
    erin.jobs.cancel(job.id)

    for token in ("", "not-the-token"):
        with Client(api_only.url, token) as anonymous, pytest.raises(Unauthorized) as refused:
            anonymous.jobs.list_page()
        assert refused.value.status_code == 401 and refused.value.code == "unauthorized"

    with pytest.raises(ValidationError) as bad:
        erin.jobs.create(example_spec(learning_rate=-1))
    assert bad.value.status_code == 422 and bad.value.code == "invalid_spec"
    assert bad.value.field == "training.learning_rate"
    assert bad.value.loc == ["body", "training", "learning_rate"]
    with pytest.raises(ValidationError) as two:
        erin.jobs.create(example_spec(learning_rate=-1, max_steps=0))
    assert set(two.value.fields) == {"training.learning_rate", "training.max_steps"}
    with pytest.raises(ValidationError) as bad_status:
        erin.jobs.list_page("bogus")
    assert bad_status.value.field == "status"

    with pytest.raises(WaitTimeout) as waited:  # no worker: it stays queued
        erin.jobs.wait(erin.jobs.create(example_spec()).id, timeout=0.3, poll=0.1)
    assert waited.value.job.status == JobStatus.queued
    erin.jobs.cancel(waited.value.job_id)

    with pytest.raises(SpecFileError, match="no such file"):
        erin.jobs.create(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(SpecFileError, match="a job spec is a mapping"):
        erin.jobs.create(tmp_path / "list.yaml")
    with pytest.raises(ConnectionFailed):
        Client(f"http://127.0.0.1:{free_port()}").health()
    with pytest.raises(InvalidURL):
        Client("not-a-url")


def test_rate_limited_carries_retry_after(api_only: Deployment) -> None:
    # frank fills his 100 active jobs (FTQ_MAX_ACTIVE_JOBS_PER_OWNER); the next one is a 429.
    with Client(api_only.url, FRANK_TOKEN) as frank:
        active = sum(1 for _ in frank.jobs.list(status="queued,starting,running,cancelling", limit=500))
        with pytest.raises(RateLimited) as limited:
            for i in range(101 - active):
                frank.jobs.create(example_spec(max_steps=1000 + i))
        assert limited.value.status_code == 429 and limited.value.code == "rate_limited"
        assert limited.value.retry_after is not None and limited.value.retry_after > 0
        assert isinstance(limited.value, FtqAPIError)


def test_deployments_through_the_sdk_and_the_cli(api_only: Deployment) -> None:
    """GET /deployments of an owner whose calls started no engine (this server serves none: an engine needs
    vLLM), through Client, AsyncClient and `ftq deployments`; tests/unit/ftq/cli/test_deployments_cli.py
    reads a listing with engines in it."""
    with Client(api_only.url, ERIN_TOKEN) as erin:
        listing = erin.deployments.list()
    assert isinstance(listing, DeploymentList)
    assert listing.data == [] and listing.usage.requests == 0 and listing.usage.since <= time.time()

    async def read() -> DeploymentList:
        async with AsyncClient(api_only.url, ERIN_TOKEN) as client:
            return await client.deployments.list()

    assert asyncio.run(read()).data == []
    with pytest.raises(Unauthorized):
        Client(api_only.url, "").deployments.list()

    shown = run_ftq("deployments", url=api_only.url, token=ERIN_TOKEN)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["no deployments: a call to a model through /v1 starts its engine"]
    as_json = run_ftq("deployments", "--json", url=api_only.url, token=ERIN_TOKEN)
    assert as_json.returncode == 0, as_json.stderr
    assert DeploymentList.model_validate_json(as_json.stdout).data == []
    refused = run_ftq("deployments", url=api_only.url)
    assert refused.returncode == 1 and refused.stderr.startswith("ftq: unauthorized (401)"), refused.stderr
