"""The dashboard in real headless Chromium against a real `ftq up`: list, charts, smoothing and log scale,
runs compared, log, plan, checkpoints, cancel, auth, the deployments page.

Screenshots go to tests/_artifacts/ (gitignored) for a human to look at.
"""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import expect

from tests.e2e.session import AUTH_TOKEN, FinishedJob, Walkthrough
from tests.harness import ARTIFACTS, Deployment, one_process_example
from tests.unit.ftq.cli.test_deployments_cli import REASON, _listing

pytestmark = pytest.mark.browser

LR_FORMAT = re.compile(r"\d\.\d\de[-+]\d\d")  # 2.50e-04, as the CLI and train.log write it
TRAIN_COLOUR, EVAL_COLOUR = "#2563eb", "#ea580c"


@pytest.mark.slow  # a real tiny training run
def test_jobs_page_lists_jobs_and_picks_up_new_ones(
    server: Deployment, finished_job: FinishedJob, page: Any
) -> None:
    page.goto(f"{server.url}/")
    row = page.locator(f'tr[data-job-id="{finished_job.job_id}"]')
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("succeeded")
    job = server.get(f"/jobs/{finished_job.job_id}")
    shown_loss = float(row.locator('td[data-field="loss"]').inner_text())
    assert shown_loss == pytest.approx(job["latest_metrics"]["loss"], rel=1e-3)
    expect(row.locator("a")).to_have_attribute("href", f"/ui/jobs/{finished_job.job_id}")

    # A job created after the page loaded appears without a reload (the page polls GET /jobs).
    with server.client() as c:
        created = c.post("/jobs", json=one_process_example(max_steps=100000))
        assert created.status_code == 201, created.text
        new_id = created.json()["id"]
        c.post(f"/jobs/{new_id}/cancel")
    expect(page.locator(f'tr[data-job-id="{new_id}"]')).to_be_visible(timeout=15_000)
    # The learning rate as the CLI and train.log write it (issue 50: three formats on the dashboard).
    expect(row.locator('td[data-field="lr"]')).to_have_text(LR_FORMAT)
    # At 1,400 px the table stays in its column, a long job name included (it overflowed: issue 50).
    with server.client() as c:
        long_name = "tiny-cpu-lora-with-evaluations-and-a-rather-long-name-for-tables"
        made = c.post("/jobs", json={**one_process_example(max_steps=100000), "name": long_name})
        assert made.status_code == 201, made.text
        c.post(f"/jobs/{made.json()['id']}/cancel")
    page.set_viewport_size({"width": 1400, "height": 900})
    expect(page.locator(f'tr[data-job-id="{made.json()["id"]}"]')).to_be_visible(timeout=15_000)
    widths = page.evaluate(
        "() => { const m = getComputedStyle(document.querySelector('main'));"
        " return [document.querySelector('table.jobs').getBoundingClientRect().width,"
        " document.querySelector('main').clientWidth"
        " - parseFloat(m.paddingLeft) - parseFloat(m.paddingRight),"
        " document.documentElement.scrollWidth]; }"
    )
    assert widths[0] <= widths[1] + 0.5 and widths[2] <= 1400, widths
    page.screenshot(path=str(ARTIFACTS / "dashboard-jobs.png"), full_page=True)


@pytest.mark.slow  # a real tiny training run
def test_job_page_charts_every_point_and_stops_polling(
    server: Deployment, finished_job: FinishedJob, page: Any, tmp_path: Path
) -> None:
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{server.url}/ui/jobs/{finished_job.job_id}")
    expect(page.locator("#refresh-state")).to_contain_text("no more updates", timeout=30_000)

    points = server.get(f"/jobs/{finished_job.job_id}/metrics")["data"]
    n_loss = sum(p["loss"] is not None for p in points)
    n_eval = sum(p["eval_loss"] is not None for p in points)
    n_lr = sum(p["learning_rate"] is not None for p in points)
    assert n_loss >= 5 and n_eval >= 1 and n_lr >= 5, points

    loss_chart = page.locator("#chart-loss svg")
    expect(loss_chart).to_have_attribute("data-points", str(n_loss + n_eval))
    train = page.locator('#chart-loss path[data-series="loss"]')
    expect(train).to_have_attribute("data-count", str(n_loss))
    assert train.get_attribute("d").count("L") == n_loss - 1  # one drawn vertex per point
    evals = page.locator('#chart-loss path[data-series="eval_loss"]')
    expect(evals).to_have_attribute("data-count", str(n_eval))
    expect(page.locator('#chart-loss g[data-series-markers="eval_loss"] circle')).to_have_count(n_eval)
    rates = page.locator('#chart-lr path[data-series="learning_rate"]')
    expect(rates).to_have_attribute("data-count", str(n_lr))
    # One learning-rate format: the job's meta and the chart's axis as the jobs table (issue 50).
    expect(page.locator("#job-meta div", has_text="latest lr").locator("dd")).to_have_text(LR_FORMAT)
    ticks = page.locator("#chart-lr text.tick").all_text_contents()
    assert ticks and all(t == "0" or LR_FORMAT.fullmatch(t) for t in ticks), ticks
    # Train blue, eval orange (the method charts follow this: see test_method_metrics_...).
    assert train.get_attribute("stroke") == TRAIN_COLOUR and evals.get_attribute("stroke") == EVAL_COLOUR
    for chart, key in (("grad-norm", "grad_norm"), ("tokens", "tokens_per_second")):
        n = sum(p[key] is not None for p in points)
        assert n >= 5, (key, points)
        expect(page.locator(f'#chart-{chart} path[data-series="{key}"]')).to_have_attribute(
            "data-count", str(n)
        )

    # Full paths on hover: the meta shows the model's last parts, its title the resolved path.
    job = server.get(f"/jobs/{finished_job.job_id}")
    model_path = job["spec"]["model"]["name_or_path"]
    expect(page.locator(f'#job-meta dd[title="{model_path}"]')).to_have_text("…/tiny/model")
    ckpts = server.get(f"/jobs/{finished_job.job_id}/checkpoints")["data"]
    assert ckpts
    expect(page.locator("#checkpoints tbody tr")).to_have_count(len(ckpts))
    expect(page.locator(f'#checkpoints code[title="{ckpts[-1]["path"]}"]')).to_be_visible()
    # Its headers apart from each other (they ran together: issue 50).
    gaps = page.evaluate(
        "() => [...document.querySelectorAll('#checkpoints th')]"
        ".map((th) => getComputedStyle(th).paddingRight)"
    )
    assert gaps and all(float(g.removesuffix("px")) >= 8 for g in gaps[:-1]), gaps
    # The job's events, one row each, in order, ending with how it ended.
    events = server.get(f"/jobs/{finished_job.job_id}/events", limit=1000)["data"]
    expect(page.locator("#event-list tr")).to_have_count(len(events))
    expect(page.locator("#event-list tr").last).to_have_attribute("data-type", "job.succeeded")
    expect(page.locator('#event-list tr[data-type="job.checkpoint"]')).to_have_count(
        sum(e["type"] == "job.checkpoint" for e in events)
    )

    # Smoothing keeps the raw line (pale, same points) and draws the EMA over it: a calmer line.
    raw_d = train.get_attribute("d")
    page.locator("#smoothing").fill("0.9")
    expect(page.locator('#chart-loss path[data-series="loss-raw"]')).to_have_attribute(
        "data-count", str(n_loss)
    )
    expect(train).to_have_attribute("data-count", str(n_loss))
    expect(loss_chart).to_have_attribute("data-points", str(n_loss + n_eval))
    assert _variation(train.get_attribute("d")) < 0.6 * _variation(raw_d)
    page.locator("#log-scale").check()
    expect(loss_chart).to_have_attribute("data-y-scale", "log")
    page.locator("#charts").screenshot(path=str(tmp_path / "charts-smoothed-log.png"))
    page.locator("#log-scale").uncheck()
    page.locator("#smoothing").fill("0")
    expect(page.locator('#chart-loss path[data-series="loss-raw"]')).to_have_count(0)

    log_text = server.get(f"/jobs/{finished_job.job_id}/logs", limit=1048576)["text"]
    assert page.locator("#log").text_content() == log_text
    expect(page.locator("#plan-command")).to_contain_text("accelerate.commands.launch")
    expect(page.locator("#plan")).to_contain_text("accelerate_config.yaml")
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#cancel")).to_be_hidden()

    # Hovering reads out the nearest step's values.
    box = loss_chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    expect(page.locator("#chart-loss g.tip")).to_have_attribute("visibility", "visible")
    page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)

    # Incremental polling: log offsets only move forward, metrics pages only move past what was read
    # (minus the one re-read last point), and a finished job is not polled any more.
    log_offsets = [int(parse_qs(urlparse(u).query)["offset"][0]) for u in requests if "/logs?" in u]
    assert log_offsets == sorted(log_offsets) and len(set(log_offsets)) == len(log_offsets), log_offsets
    metric_afters = [int(parse_qs(urlparse(u).query)["after_step"][0]) for u in requests if "/metrics?" in u]
    assert metric_afters == sorted(metric_afters), metric_afters
    settled = len(requests)
    page.wait_for_timeout(3500)
    assert len(requests) == settled, requests[settled:]


@pytest.mark.slow  # a real tiny training run
def test_cancel_button_stops_a_running_job(server: Deployment, page: Any) -> None:
    with server.client() as c:
        resp = c.post("/jobs", json=one_process_example(max_steps=100000, logging_steps=1))
        assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    server.wait_for(job_id, lambda j: j["status"] == "running", timeout=120, what="running")

    dialogs: list[str] = []

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    page.goto(f"{server.url}/ui/jobs/{job_id}")
    expect(page.locator("#job-status")).to_have_attribute("data-status", "running")
    page.locator("#cancel").click()
    expect(page.locator("#job-status")).to_have_attribute("data-status", re.compile("cancelling|cancelled"))
    assert dialogs and job_id in dialogs[0]
    expect(page.locator("#job-status")).to_have_attribute("data-status", "cancelled", timeout=90_000)
    expect(page.locator("#cancel")).to_be_hidden()
    job = server.get(f"/jobs/{job_id}")
    assert job["status"] == "cancelled" and job["error"] is None
    expect(page.locator("#error-box")).to_be_hidden()
    page.screenshot(path=str(ARTIFACTS / "dashboard-cancelled.png"), full_page=True)


def test_progress_says_what_a_job_does_before_its_first_step_and_while_it_saves(
    server: Deployment, page: Any
) -> None:
    # The list and the job page share this text; the API's phases come from service/jobs/phase.py.
    page.goto(f"{server.url}/")
    text = "job => FTQ.progressText(job)"
    loading = {
        "status": "running",
        "progress": {"phase": "loading", "message": "loading the model", "step": None, "max_steps": 40},
    }
    saving = {
        "status": "running",
        "progress": {"phase": "saving", "message": "saving the final model", "step": 40, "max_steps": 40},
    }
    training = {
        "status": "running",
        "progress": {"phase": "training", "message": None, "step": 7, "max_steps": 40},
    }
    failed = {
        "status": "failed",
        "progress": {"phase": None, "message": "loading the model", "step": None, "max_steps": 40},
    }
    assert page.evaluate(text, loading) == "loading the model"
    assert page.evaluate(text, saving) == "40 / 40 · saving the final model"
    assert page.evaluate(text, training) == "7 / 40"
    assert page.evaluate(text, failed) == "0 / 40"


def test_token_from_the_url_is_kept_for_the_tab_and_401_is_explained(
    auth_server: Deployment, page: Any
) -> None:
    page.goto(f"{auth_server.url}/")
    banner = page.locator("#banner")
    expect(banner).to_contain_text("401")
    expect(banner).to_contain_text("?token=")
    page.screenshot(path=str(ARTIFACTS / "dashboard-401.png"))

    page.goto(f"{auth_server.url}/?token={AUTH_TOKEN}")
    expect(page.locator("#jobs")).to_have_attribute("data-count", "0")
    expect(page.locator("#empty")).to_be_visible()
    expect(banner).to_be_hidden()
    assert "token" not in page.url  # taken out of the address bar at once
    assert page.evaluate("sessionStorage.getItem('ftq.token')") == AUTH_TOKEN

    # The token follows the tab to a job page: an unknown job is a 404 there, not a 401.
    page.goto(f"{auth_server.url}/ui/jobs/job_0000000000000000")
    expect(banner).to_contain_text("Not found")
    expect(banner).not_to_contain_text("401")

    # The form in the banner takes a token as well.
    page.evaluate("sessionStorage.clear()")
    page.goto(f"{auth_server.url}/")
    page.locator("#token-input").fill(AUTH_TOKEN)
    page.locator("#token-form button").click()
    expect(page.locator("#jobs")).to_have_attribute("data-count", "0")


def test_deployments_page_is_linked_from_the_jobs_page_and_lists_the_engines(
    auth_server: Deployment, page: Any
) -> None:
    page.goto(f"{auth_server.url}/?token={AUTH_TOKEN}")
    expect(page.locator("#jobs")).to_have_attribute("data-count", "0")
    page.locator('nav a[data-nav="deployments"]').click()
    expect(page).to_have_url(f"{auth_server.url}/ui/deployments")
    expect(page.locator('nav a[aria-current="page"]')).to_have_text("deployments")
    table = page.locator("#deployments")
    # The server's own answer: no engine started.
    expect(table).to_have_attribute("data-count", "0", timeout=15_000)
    expect(page.locator("#empty")).to_be_visible()

    # An engine needs vLLM: the list's shape with engines in it is the unit tests' listing, answered in
    # the browser in place of the server's (the page polls GET /deployments).
    listing = _listing().model_dump(mode="json")
    page.route(lambda url: urlparse(url).path == "/deployments", lambda route: route.fulfill(json=listing))
    expect(table).to_have_attribute("data-count", "3", timeout=15_000)
    expect(page.locator("#empty")).to_be_hidden()
    ready = page.locator('tr[data-deployment-id="dep_00000000000000a1"]')
    expect(ready.locator(".badge")).to_have_text("ready")
    times = "\N{MULTIPLICATION SIGN}"
    expect(ready.locator('td[data-field="devices"]')).to_have_text(f"cpu {times} 1")  # nothing under it
    expect(ready.locator('td[data-field="adapters"]')).to_have_text("2")
    expect(ready.locator('td[data-field="requests"]')).to_have_text("14")
    expect(ready.locator('td[data-field="tokens"]')).to_have_text("1.2k / 340")
    expect(ready.locator('td[data-field="device-time"]')).to_have_text("3m12s")
    queued = page.locator('tr[data-deployment-id="dep_00000000000000a2"]')
    expect(queued.locator(".why")).to_have_text(REASON)
    expect(queued.locator('td[data-field="devices"] .devices')).to_have_text(f"cuda {times} 4")
    expect(queued.locator('td[data-field="devices"] .muted')).to_have_text("tensor parallel 4 · slurm")
    failed = page.locator('tr[data-deployment-id="dep_00000000000000a3"]')
    expect(failed.locator(".why.bad")).to_contain_text("exited with code 1")
    expect(page.locator("#summary .count")).to_have_count(3)
    expect(page.locator("#usage")).to_contain_text("123470 requests, 99M tokens in, 1.2M out")

    # The Tinker training clients under them (GET /training_clients): the server's empty list, then a
    # constructed one (a running client and one saved idle) answered in the browser.
    clients = page.locator("#training-clients")
    expect(clients).to_have_attribute("data-count", "0", timeout=15_000)
    expect(page.locator("#tc-empty")).to_be_visible()
    page.route(
        lambda url: urlparse(url).path == "/training_clients",
        lambda route: route.fulfill(json=_training_clients().model_dump(mode="json")),
    )
    expect(clients).to_have_attribute("data-count", "2", timeout=15_000)
    running = page.locator('tr[data-training-client-id="ses_00000000000000a1:train:0"]')
    expect(running.locator(".badge")).to_have_text("running")
    expect(running.locator('td[data-field="step"]')).to_have_text("0.031 s")
    expect(running.locator('td[data-field="device-time"]')).to_have_text("2m05s")
    paused = page.locator('tr[data-training-client-id="ses_00000000000000a1:train:1"]')
    expect(paused.locator(".why")).to_contain_text("saved idle")
    page.screenshot(path=str(ARTIFACTS / "dashboard-deployments.png"), full_page=True)


def _training_clients() -> Any:
    from ftq.contract.tinker import TrainingClientInfo, TrainingClientList

    now = datetime.now(UTC)
    common: dict[str, Any] = {
        "base": "ftq-tiny",
        "lora_rank": 8,
        "device": "cpu",
        "devices": 1,
        "launcher": "local",
    }
    return TrainingClientList(
        data=[
            TrainingClientInfo(
                id="ses_00000000000000a1:train:0", status="running", created_at=now, started_at=now,
                last_used_at=now, device_seconds=125.0, last_step_seconds=0.031, **common,
            ),
            TrainingClientInfo(
                id="ses_00000000000000a1:train:1", status="paused", created_at=now, last_used_at=now,
                device_seconds=40.0, **common,
            ),
        ]
    )  # fmt: skip


def test_pages_are_not_in_the_openapi_document_and_send_a_csp(server: Deployment) -> None:
    with server.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
        assert not [p for p in paths if p == "/" or p.startswith("/ui") or p == "/metrics"]
        page = c.get("/ui/jobs/job_x")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "<script>" not in page.text  # every script is a file: the CSP allows no inline code
        assert c.get("/ui/static/../../app.py").status_code == 404
        assert c.get("/ui/static/job.js").headers["content-type"].startswith("text/javascript")


@pytest.mark.slow  # two real tiny training runs (the session's and the curl walkthrough's)
def test_two_runs_compared_on_one_loss_chart_with_a_log_scale(
    server: Deployment, finished_job: FinishedJob, walkthrough: Walkthrough, page: Any, tmp_path: Path
) -> None:
    code, output = walkthrough.wait()
    assert code == 0, output
    other = re.search(r"job id: (job_[0-9a-f]+)", output)
    assert other
    ids = [finished_job.job_id, other.group(1)]
    n_loss = {i: sum(p["loss"] is not None for p in server.get(f"/jobs/{i}/metrics")["data"]) for i in ids}

    # A stale id in a shared link drops out of the comparison; the table goes on refreshing.
    page.goto(f"{server.url}/?compare=job_0000000000000000")
    expect(page.locator(f'tr[data-job-id="{ids[0]}"]')).to_be_visible()
    # Not wait_for_function: a string predicate is evaluated in the page, which the dashboard's CSP
    # (script-src 'self') refuses now and then as a page error.
    expect(page).not_to_have_url(re.compile(r"[?&]compare="))
    expect(page.locator("#compare")).to_be_hidden()
    expect(page.locator("#banner")).to_be_hidden()
    for job_id in ids:
        page.locator(f'input.pick[data-job-id="{job_id}"]').check()
    chart = page.locator("#chart-compare svg")
    expect(chart).to_have_attribute("data-series-count", "2")
    for job_id in ids:
        line = page.locator(f'#chart-compare path[data-series="{job_id}"]')
        expect(line).to_have_attribute("data-count", str(n_loss[job_id]))
    colours = {page.locator(f'#chart-compare path[data-series="{i}"]').get_attribute("stroke") for i in ids}
    assert len(colours) == 2, colours  # same seed and spec: the lines coincide, the colours must not
    legend = page.locator("#chart-compare .legend-entry")
    expect(legend).to_have_count(2)
    assert sorted(legend.locator("title").all_text_contents()) == sorted(
        f"tiny-cpu-lora ({i}, succeeded)" for i in ids
    )
    assert f"compare={ids[0]}%2C{ids[1]}" in page.url  # the comparison survives a reload or a shared link
    # Paths are shortened in the table; the full, resolved path is the hover text.
    model_cell = page.locator(f'tr[data-job-id="{ids[0]}"] .model-path')
    expect(model_cell).to_have_attribute(
        "title", server.get(f"/jobs/{ids[0]}")["spec"]["model"]["name_or_path"]
    )
    page.screenshot(path=str(tmp_path / "compare-linear.png"), full_page=True)

    # A linear axis spaces its ticks evenly; a log axis squeezes them as the values grow.
    linear = _tick_gaps(page)
    assert len(linear) >= 2 and max(linear) - min(linear) < 0.05, linear
    page.locator("#log-scale").check()
    expect(chart).to_have_attribute("data-y-scale", "log")
    gaps = _tick_gaps(page)
    assert len(gaps) >= 2 and all(a > b + 0.3 for a, b in itertools.pairwise(gaps)), gaps
    page.screenshot(path=str(tmp_path / "compare-log.png"), full_page=True)

    # Unticking a run takes its line off the chart; the last one off hides the chart.
    page.locator(f'input.pick[data-job-id="{ids[1]}"]').uncheck()
    expect(chart).to_have_attribute("data-series-count", "1")
    page.locator("#compare-clear").click()
    expect(page.locator("#compare")).to_be_hidden()


def _tick_gaps(page: Any) -> list[float]:
    """Pixel gaps between the comparison chart's y ticks, lowest value first."""
    ys = [
        float(y)
        for y in page.locator("#chart-compare .y-axis text.tick").evaluate_all(
            "ts => ts.map(t => t.getAttribute('y'))"
        )
    ]
    return [a - b for a, b in itertools.pairwise(ys)]


def _variation(d: str) -> float:
    """The summed vertical movement of an SVG path's vertices (its total variation, in pixels)."""
    ys = [float(y) for y in re.findall(r"[ML][-\d.]+,([-\d.]+)", d)]
    return sum(abs(a - b) for a, b in itertools.pairwise(ys))


@pytest.mark.slow  # a real tiny DPO run (the session's, which test_methods_http reads too)
def test_method_metrics_get_a_chart_per_name_group(server: Deployment, dpo_job: str, page: Any) -> None:
    """Point.extra on the job page: DPO's rewards/* (train, and eval as markers) in one `rewards` chart."""
    job_id = dpo_job  # 10 steps, logged at each, evaluated at 5 and 10
    job = server.wait_terminal(job_id, timeout=600)
    assert job["status"] == "succeeded", server.report(job_id)
    points = server.get(f"/jobs/{job_id}/metrics")["data"]
    n = sum(p["extra"] is not None and "rewards/margins" in p["extra"] for p in points)
    n_eval = sum(p["extra"] is not None and "eval_rewards/margins" in p["extra"] for p in points)
    assert (n, n_eval) == (10, 2), points

    page.goto(f"{server.url}/ui/jobs/{job_id}")
    expect(page.locator("#refresh-state")).to_contain_text("no more updates", timeout=30_000)
    expect(page.locator("#method-charts")).to_be_visible()
    rewards = page.locator('#method-charts .chart[data-group="rewards"]')
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        expect(rewards.locator(f'path[data-series="{name}"]')).to_have_attribute("data-count", str(n))
    # Evaluation's values (eval_ names) in the same group, as markers.
    expect(rewards.locator('path[data-series="eval_rewards/margins"]')).to_have_attribute("data-count", "2")
    # Train names take the loss chart's train colour first, eval names come after (they were swapped).
    first_train = rewards.locator('path[data-series="rewards/accuracies"]')
    assert first_train.get_attribute("stroke") == TRAIN_COLOUR
    assert (
        rewards.locator('path[data-series="eval_rewards/accuracies"]').get_attribute("stroke") != TRAIN_COLOUR
    )
    expect(page.locator('#method-charts .chart[data-group="logps"]')).to_have_count(1)
    page.locator("#method-charts").screenshot(path=str(ARTIFACTS / "dashboard-method-charts.png"))
