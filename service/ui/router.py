"""Dashboard routes: `/` (jobs at a glance, runs compared on one loss chart), `/ui/jobs/{id}` (loss, LR,
grad-norm and tokens/s charts, log tail, plan, checkpoints, cancel) and `/ui/deployments` (the engines that
answer the owner's /v1 calls: status, devices, adapters, requests, tokens, device time).

The pages are static HTML; their JS calls the public JSON API, so the pages need no token of their
own and the API's owner rules apply unchanged. When auth is on, the JS takes the token from `?token=`
once, keeps it in sessionStorage and sends it as a bearer token. None of these routes are in the
OpenAPI document: it stays about the API.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse

from ftq import __version__
from service.errors import NotFound

router = APIRouter(include_in_schema=False)

UI_DIR = Path(__file__).resolve().parent
STATIC_DIR = UI_DIR / "static"
TEMPLATES_DIR = UI_DIR / "templates"

MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

# Everything the pages load comes from this server, and no inline script runs: the job data the pages
# show (names, logs) is user-controlled, so a script injected through it has nowhere to execute.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@lru_cache
def _page(name: str, title: str, script: str) -> str:
    """A page: the shared <head> (`_head.html`: styles, the common scripts and the page's own), then the
    page's body."""
    head = (TEMPLATES_DIR / "_head.html").read_text(encoding="utf-8")
    head = head.replace("{{title}}", title).replace("{{script}}", script)
    page = (TEMPLATES_DIR / name).read_text(encoding="utf-8").replace("{{head}}\n", head)
    # The version in static URLs makes browsers fetch new assets after an upgrade.
    return page.replace("{{version}}", __version__)


@router.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
def jobs_page() -> HTMLResponse:
    return HTMLResponse(_page("index.html", "jobs", "jobs.js"), headers=SECURITY_HEADERS)


@router.api_route("/ui/jobs/{job_id}", methods=["GET", "HEAD"], response_class=HTMLResponse)
def job_page(job_id: str) -> HTMLResponse:
    # The job id is read by the page's JS from the URL; the HTML is the same for every job.
    return HTMLResponse(_page("job.html", "job", "job.js"), headers=SECURITY_HEADERS)


@router.api_route("/ui/deployments", methods=["GET", "HEAD"], response_class=HTMLResponse)
def deployments_page() -> HTMLResponse:
    return HTMLResponse(_page("deployments.html", "deployments", "deployments.js"), headers=SECURITY_HEADERS)


@router.get("/ui/static/{name}")
def static_file(name: str) -> FileResponse:
    path = STATIC_DIR / name
    media_type = MEDIA_TYPES.get(path.suffix)
    # Only plain file names of known types inside static/: no `..`, no other folders.
    if "/" in name or name.startswith(".") or media_type is None or not path.is_file():
        raise NotFound(f"no static file {name}")
    return FileResponse(
        path,
        media_type=media_type,
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "public, max-age=300"},
    )
