"""A short NCCL all-reduce across every GPU of a multi-node job, run by its job.sbatch before the launch
(render.node_check_lines) under torch.distributed.run: it logs the measured bus bandwidth to train.log
and, when it is far under what the fabric should give (NCCL fell back to TCP sockets, or the job got the
wrong NICs: 10-50x slower and silent), appends a `nccl_bandwidth` line to the run's warnings.jsonl,
which the worker's ingest turns into a job.warning event. It never fails the job.

Bus bandwidth as nccl-tests defines it: bytes x 2(n-1)/n / seconds for an all-reduce, the figure
FTQ_INTER_NODE_GBPS is given in.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

MESSAGE_BYTES = 256 * 1024**2  # large enough for NCCL's ring to reach its bandwidth
WARMUP = 3
ITERATIONS = 10


def bus_gbps(message_bytes: int, world: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth of one all-reduce, in GB/s."""
    return message_bytes * 2 * (world - 1) / world / seconds / 1e9


def warning_line(measured: float, expected: float, threshold: float, world: int) -> dict[str, object]:
    return {
        "kind": "nccl_bandwidth",
        "step": None,
        "message": (
            f"NCCL all-reduce across {world} GPUs measured {measured:.1f} GB/s of bus bandwidth, under "
            f"{threshold:g} GB/s ({expected:g} expected, FTQ_INTER_NODE_GBPS): collectives may be going "
            "over TCP sockets instead of InfiniBand/RoCE (check NCCL_IB_HCA, NCCL_SOCKET_IFNAME and "
            "NCCL_DEBUG=INFO in train.log); the job runs on, slower than planned"
        ),
        "time": time.time(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftq.planning.nccl_check")
    parser.add_argument("--expect-gbps", type=float, required=True)
    parser.add_argument("--warn-below", type=float, required=True)
    parser.add_argument("--warnings", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        buf = torch.ones(MESSAGE_BYTES // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(WARMUP):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(ITERATIONS):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / ITERATIONS
        measured = bus_gbps(MESSAGE_BYTES, world, seconds)
        if rank == 0:
            print(
                f"ftq: NCCL all-reduce of {MESSAGE_BYTES // 1024**2} MiB across {world} GPUs: "
                f"{measured:.1f} GB/s bus bandwidth ({args.expect_gbps:g} expected)",
                flush=True,
            )
            if measured < args.warn_below:
                with args.warnings.open("a", encoding="utf-8") as out:
                    out.write(
                        json.dumps(warning_line(measured, args.expect_gbps, args.warn_below, world)) + "\n"
                    )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
