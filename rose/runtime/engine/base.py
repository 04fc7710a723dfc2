"""The engine surfaces ROSE uses: `Engine`, one inference engine, and `RolloutEngine`, where rollout
tasks send their policy turns.

An `Engine` is stepped by the one thread that owns it: the engine loop on a dedicated worker, the
co-serving executor on a serving worker; both see only this protocol. `VllmEngine` is the real
implementation; `FakeEngine` exists for pure-logic unit tests only. Both owners are `RolloutEngine`s,
the only surface the rollout op sees, so the agent loop runs unchanged on either kind of worker.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Iterable, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingSpec:
    """What to generate for one request (one policy turn)."""

    max_tokens: int  # new tokens at most
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # generation ends after emitting one of these (it is kept)
    seed: int | None = None  # per-request sampling seed; None = engine's RNG
    # Each new token's log-prob comes with it (a rollout's behaviour log-probs). The serving front end asks
    # for none: its clients get text, and vLLM's log-softmax over the vocabulary was 14 % of a serving
    # step of 20 sequences here (1.43 against 1.23 ms).
    logprobs: bool = True


@dataclass(frozen=True)
class EngineOutput:
    """New tokens of one request from one engine iteration."""

    request_id: str
    token_ids: list[int]  # tokens produced in this iteration (delta)
    logprobs: list[float]  # log-prob of each new token under the behaviour policy ([]: the request asked for none)
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    error: str | None = None  # the engine failed this request (finished is then True)
    # No tokens: the request made its first token in this iteration (an engine that returns a request's
    # tokens at its end only says so apart, for the request's `queue_s`)
    started: bool = False


@dataclass
class Generation:
    """The result of one rollout request: the new tokens with their behaviour log-probs and versions."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)  # engine weight version per token
    finish_reason: str | None = None  # stop | length | abort
    queue_s: float = 0.0  # submit -> first token, seconds
    total_s: float = 0.0  # submit -> finished, seconds


@runtime_checkable
class Engine(Protocol):
    max_model_len: int  # prompt + generated tokens at most

    @property
    def weight_version(self) -> int:
        """Version of the weights loaded now (0 = the initial checkpoint)."""

    def add_request(self, request_id: str, prompt_token_ids: list[int], spec: SamplingSpec) -> None:
        """Queue a request; raises PromptTooLongError if it cannot fit the context."""

    def step(self) -> list[EngineOutput]:
        """Run one engine iteration; returns the outputs of requests that advanced."""

    def abort(self, request_ids: Iterable[str]) -> None: ...

    def has_unfinished(self) -> bool: ...

    def num_running(self) -> int: ...

    def kv_usage(self) -> float:
        """Fraction of KV cache in use, 0..1."""

    def load_weights(self, named_tensors: dict, version: int) -> None:
        """Replace all weights in place and set `weight_version`; only between iterations."""


@runtime_checkable
class RolloutEngine(Protocol):
    """A rollout engine behind its owning thread (`EngineLoop`, `CoServingExecutor`). Thread-safe; no
    call blocks."""

    @property
    def weight_version(self) -> int:
        """Version of the rollout weights loaded now (-1: no rollout engine yet)."""

    def generate(self, prompt_token_ids: list[int], spec: SamplingSpec,
                 request_id: str | None = None) -> Future[Generation]:
        """Queue one request; resolves to its `Generation`, or raises (prompt too long, engine error)."""

    def load_weights(self, named_tensors: dict, version: int) -> Future[int]:
        """Swap the rollout weights between two iterations once no rollout request is in flight (the
        tokens of each keep one version; requests queued after the swap wait for it); resolves to
        `version` once the engine holds it."""

    def counters(self) -> dict[str, float]:
        """Counters since start, read by reports and benchmarks: at least `rollout_steps` (rollout
        engine iterations), `rollout_tokens` (tokens generated for rollout requests) and `rollout_requests`
        (rollout requests resolved: finished, or failed by the engine)."""

    def close(self, timeout: float = 10.0) -> None:
        """Stop the owning thread; requests still unfinished fail with EngineError."""
