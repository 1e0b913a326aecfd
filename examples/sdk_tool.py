"""An internal tool on the ftq SDK: submit the tiny job, follow its log, read its loss curve.

Run it against a server (`make up`, or FTQ_URL=... FTQ_TOKEN=...): .venv/bin/python examples/sdk_tool.py
"""

import sys
from pathlib import Path

from ftq.client import Client

spec = Path(__file__).with_name("tiny-cpu.yaml")
with Client() as ftq:  # FTQ_URL (else FTQ_PORT) and FTQ_TOKEN, or Client("http://host:8000", "token")
    job = ftq.jobs.create(spec)
    print(f"submitted {job.id} ({job.status})")
    for line in ftq.jobs.logs(job.id, follow=True):  # until the job ends and its log is read
        print("  |", line)
    job = ftq.jobs.wait(job.id, timeout=600)
    losses = [p.loss for p in ftq.jobs.iter_metrics(job.id) if p.loss is not None]
    print(f"{job.id} {job.status}: loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    sys.exit(0 if job.status == "succeeded" else 1)
