"""Serving (issue 49): the bodies of OpenAI's `POST /v1/chat/completions` and `POST /v1/completions` as
ftq takes them, and the native view of the engines that answer them (`GET /deployments`).

A request body names only what the generation engine does here: the sampling parameters below, each
bounded. Any other field is refused (a 400 naming it, as OpenAI refuses an unknown argument), so that
nothing the server does not check reaches the engine: no tools, no response_format, no images."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# Completions one request may ask for (`n`), prompts one /v1/completions request may hold, and messages one
# chat request may hold.
MAX_CHOICES = 8
MAX_PROMPTS = 64
MAX_MESSAGES = 512
MAX_PARTS = 32  # text parts of one message's content
MAX_STOP = 4
MAX_TEXT = 262_144  # characters of a message, a part or a prompt (the body cap, FTQ_MAX_BODY_BYTES, first)
MAX_TOKEN_IDS = 32_768  # token ids of one prompt


Text = Annotated[str, Field(max_length=MAX_TEXT)]
TokenIds = Annotated[list[int], Field(max_length=MAX_TOKEN_IDS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    """A message's content as parts: text only (the models served here read no images or audio)."""

    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | Annotated[list[TextPart], Field(max_length=MAX_PARTS)]
    name: str | None = Field(None, max_length=256)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """What both requests share: the model, streaming, and the sampling parameters the engine takes."""

    model: str = Field(min_length=1, max_length=512)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: Annotated[str, Field(max_length=256)] | Annotated[list[str], Field(max_length=MAX_STOP)] | None = (
        None
    )
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(None, max_length=300)
    user: str | None = Field(None, max_length=256)  # taken, not passed on: the caller is the token's owner


class ChatCompletionCreate(_Sampling):
    """`POST /v1/chat/completions`: the conversation is rendered with the model's own chat template (for a
    fine-tuned model, the one its job trained with: the template of the tokenizer it saved)."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionCreate(_Sampling):
    """`POST /v1/completions`: raw text (or token ids) continued, without a chat template."""

    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False


class DeploymentAdapter(BaseModel):
    model: str = Field(description="The name it is called by: an `ft:` model or a checkpoint's model.")
    loaded_at: float = Field(description="When it was loaded into the engine (Unix seconds).")


class Deployment(BaseModel):
    """One engine of the caller's: a base model served with the caller's adapters on it. It is a run the
    scheduler places like a job's (devices, quotas, fair share); its device time counts in `/usage`."""

    id: str
    base: str = Field(
        description="The base model it serves: a catalog alias, or the `ft:` model of a full "
        "fine-tune (an engine of its own)"
    )
    status: Literal["queued", "starting", "ready", "failed", "stopping", "stopped"] = Field(
        description="queued (waiting for devices: `queue_reason` says why), starting (launched, loading "
        "the base), ready (answering), stopping, stopped (idle past FTQ_SERVE_IDLE_SECONDS, or freed), "
        "failed (`error` says why)"
    )
    device: Literal["cpu", "cuda"]
    launcher: Literal["local", "slurm"] = Field("local", description="Where it runs.")
    devices: int = Field(1, description="GPUs (cuda) or CPU slots (cpu) it holds.")
    tensor_parallel_size: int = Field(
        1, description="GPUs the base is split over (from the estimate: 1 where one GPU holds it)."
    )
    queue_reason: str | None = Field(
        None, description="While queued: why it waits (as a job's queue reason)."
    )
    error: str | None = Field(None, description="Why it failed.")
    adapters: list[DeploymentAdapter] = Field(description="The adapters loaded into it, oldest first.")
    started_at: float = Field(description="When it was asked for (Unix seconds).")
    ready_at: float | None = Field(None, description="When it first answered (Unix seconds).")
    last_used: float = Field(
        description="When a request last used it (Unix seconds); it is stopped "
        "FTQ_SERVE_IDLE_SECONDS after that."
    )
    device_seconds: float = Field(description="Its devices x the time it has held them.")
    requests: int = Field(description="Requests it answered.")
    prompt_tokens: int = Field(description="Tokens in: the prompts of the requests it answered.")
    completion_tokens: int = Field(description="Tokens out: what it generated.")


class ServingUsage(BaseModel):
    """The caller's calls answered by all their engines (those stopped included)."""

    since: float = Field(description="When the caller's first engine was asked for (Unix seconds).")
    requests: int
    prompt_tokens: int = Field(description="Tokens in, from the engines' `usage`.")
    completion_tokens: int = Field(description="Tokens out, from the engines' `usage`.")


class DeploymentList(BaseModel):
    data: list[Deployment]
    usage: ServingUsage
