"""The SDK's binary messages (forward_backward's request and result, sample's result), with the SDK's own
generated protobuf module, so the wire format is the SDK's by construction.

The module is loaded from the installed `tinker` distribution on its own: importing the `tinker` package
would import its types, which import torch where it is installed, and the API never loads torch."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from service.errors import BadRequest

_NAME = "ftq_tinker_public_pb2"


def _load() -> ModuleType:
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    package = importlib.util.find_spec("tinker")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise RuntimeError("the tinker package is not installed (make install puts it in)")
    path = Path(next(iter(package.submodule_search_locations))) / "proto" / "tinker_public_pb2.py"
    spec = importlib.util.spec_from_file_location(_NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


pb: Any = _load()

_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


def _array(raw: bytes, dtype: int) -> np.ndarray:
    if dtype == pb.DTYPE_BFLOAT16:
        # bfloat16 is the top half of a float32.
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype not in _DTYPES:
        raise BadRequest(f"a loss_fn_input tensor has dtype {dtype}, which this server does not read")
    return np.frombuffer(raw, _DTYPES[dtype])


def _tensor(t: Any) -> dict[str, Any]:
    """A Tensor message as the host takes it: flat data, its shape, int64 or float32."""
    shape = list(t.shape)
    if t.WhichOneof("encoding") == "sparse_csr":
        values = _array(t.sparse_csr.values, t.dtype)
        crow = np.frombuffer(t.sparse_csr.crow_indices, np.int64)
        cols = np.frombuffer(t.sparse_csr.col_indices, np.int64)
        dense = np.zeros(shape, dtype=values.dtype)
        for row in range(len(crow) - 1):
            dense[row, cols[crow[row] : crow[row + 1]]] = values[crow[row] : crow[row + 1]]
        arr = dense
    else:
        arr = _array(t.dense, t.dtype)
        if shape:
            arr = arr.reshape(shape)
    kind = "int64" if np.issubdtype(arr.dtype, np.integer) else "float32"
    return {"data": arr.reshape(-1).tolist(), "shape": list(arr.shape), "dtype": kind}


def _tokens(chunks: Any) -> list[int]:
    out: list[int] = []
    for chunk in chunks:
        which = chunk.WhichOneof("chunk")
        if which != "encoded_text":
            raise BadRequest(
                f"model_input chunks of type {which} are not supported by this server (text only)"
            )
        out.extend(np.frombuffer(chunk.encoded_text.tokens, np.int32).tolist())
    return out


def parse_forward_backward(body: bytes) -> dict[str, Any]:
    """A ForwardBackwardRequest as a dict: model_id, seq_id, and the host's forward_backward body."""
    m = pb.ForwardBackwardRequest()
    try:
        m.ParseFromString(body)
    except Exception:
        raise BadRequest("the body is not a tinker ForwardBackwardRequest (protobuf)") from None
    config: dict[str, float] = {k: float(v) for k, v in m.loss_fn_config.items()}
    for k, v in m.loss_fn_config_v2.items():
        if v.WhichOneof("value") == "number":
            config[k] = float(v.number)
        else:
            raise BadRequest(f"loss_fn_config {k!r} is text, which no loss of this server reads")
    data = []
    for d in m.data:
        if len(d.model_input_spans) or len(d.loss_fn_input_spans):
            raise BadRequest("provenance spans (stable_reinforce) are not supported by this server")
        data.append(
            {
                "tokens": _tokens(d.model_input),
                "loss_fn_inputs": {k: _tensor(v) for k, v in d.loss_fn_inputs.items()},
            }
        )
    return {
        "model_id": m.model_id,
        "seq_id": int(m.seq_id),
        "op": {
            "data": data,
            "loss_fn": m.loss_fn,
            "loss_fn_config": config,
            "forward_only": bool(m.forward_only),
        },
    }


def forward_backward_output(result: dict[str, Any]) -> bytes:
    """The host's answer as the SDK's ForwardBackwardOutput: one ArrayRecord, each field a BatchedTensor
    over the datums (their float32 values concatenated, byte offsets between them)."""
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    outputs = result["loss_fn_outputs"]
    record = out.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in ("logprobs", "elementwise_loss"):
        parts = [np.asarray(o.get(name, []), np.float32).tobytes() for o in outputs]
        offsets = np.cumsum([0, *(len(p) for p in parts)]).astype(np.int64)
        field = record.fields[name]
        field.dtype = pb.DTYPE_FLOAT32
        field.data = b"".join(parts)
        field.offsets = offsets.tobytes()
    for key, value in result.get("metrics", {}).items():
        out.metrics[key] = float(value)
    return bytes(out.SerializeToString())


def sample_output(result: dict[str, Any]) -> bytes:
    """The host's samples as the SDK's SampleResponse (prompt logprobs with NaN where none is defined)."""
    out = pb.SampleResponse()
    for s in result["sequences"]:
        seq = out.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if s["stop_reason"] == "stop" else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(s["tokens"], np.int32).tobytes()
        seq.logprobs = np.asarray(s["logprobs"], np.float32).tobytes()
    prompt = result.get("prompt_logprobs")
    if prompt is not None:
        values = [math.nan if v is None else float(v) for v in prompt]
        out.prompt_logprobs = np.asarray(values, np.float32).tobytes()
    return bytes(out.SerializeToString())
