"""The `Engine` protocol: the one surface of an inference engine that ROSE uses.

The engine loop, the rollout op and (later) the co-serving executor see only this protocol.
`VllmEngine` is the real implementation; `FakeEngine` exists for pure-logic unit tests only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingSpec:
    """What to generate for one request (one policy turn)."""

    max_tokens: int  # new tokens at most
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # generation ends after emitting one of these (it is kept)
    seed: int | None = None  # per-request sampling seed; None = engine's RNG


@dataclass(frozen=True)
class EngineOutput:
    """New tokens of one request from one engine iteration."""

    request_id: str
    token_ids: list[int]  # tokens produced in this iteration (delta)
    logprobs: list[float]  # log-prob of each new token under the behaviour policy
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    error: str | None = None  # the engine failed this request (finished is then True)


@runtime_checkable
class Engine(Protocol):
    max_model_len: int  # prompt + generated tokens at most

    @property
    def weight_version(self) -> int:
        """Version of the weights loaded now (0 = the initial checkpoint)."""

    def add_request(self, request_id: str, prompt_token_ids: list[int], spec: SamplingSpec,
                    priority: int = 0) -> None:
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
