"""`Host`: what a ROSE worker holds for its role, built when the worker starts and prepared once per run.

A worker's plugin holds one host and treats every kind alike: `RolloutHost` (dedicated role),
`ServingHost` (serving role, in `rose.runtime.coserve.host`) and `TrainerHost`. A rollout-capable
host exposes, once prepared, what the rollout op uses: `engine` (`generate`, `load_weights`,
`weight_version`) and the run's `tokenizer`.
"""
from __future__ import annotations

import asyncio

from rose.runtime.engine.base import RolloutEngine
from rose.runtime.protocol import ModelSpec


class Host:
    engine: RolloutEngine | None = None  # rollout hosts, once prepared: where rollout turns and synced weights go
    tokenizer = None  # rollout hosts, once prepared: the run's tokenizer (transformers)
    # Trajectories of the rollout tasks running here (what the placement counts as this worker's used
    # slots); the worker plugin keeps it
    in_flight: int = 0

    def __init__(self, address: str, weights, cores: tuple[int, ...] | None = None):
        self.address = address  # the worker's
        self.weights = weights  # the worker's WeightEndpoint; `prepare` leaves it holding version 0
        self.cores = cores  # CPU cores this host's compute is bound to (None: left as is)
        self.spec: ModelSpec | None = None  # the run it is prepared for

    async def start(self) -> None:
        """Start what the host runs for the worker's whole life, not per run (the serving role's HTTP
        front end); on the worker's event loop, once, as the worker starts."""

    def prepare(self, spec: ModelSpec) -> None:
        """Get ready for a run of `spec` on weights version 0, straight from the model directory; the
        weight endpoint then holds version 0 too. Runs in a task thread."""
        raise NotImplementedError

    @property
    def slots(self) -> int:
        """Rollout sequences this host can run at once now."""
        return 0

    @property
    def unusable(self) -> str | None:
        """Why this host's rollout engine takes no more work (a weight load into it raised part way:
        `rose.runtime.engine.pending.unusable`), or None."""
        return getattr(self.engine, "broken", None) if self.engine is not None else None

    def report(self) -> dict:
        """This host's fields of the worker's `WorkerReport`."""
        # The version the rollout engine runs; without one (the trainer), the endpoint's: last published.
        version = self.engine.weight_version if self.engine is not None else self.weights.version
        return {"weight_version": version, "model": self.spec.model_dir if self.spec else None}

    async def load_weights(self, tensors: dict, version: int) -> None:
        """A synced version into the rollout engine, between two of its iterations (the weight endpoint's
        commit target). Without an engine (the trainer, a rollout host never prepared) only the endpoint
        holds the version."""
        if self.engine is not None:
            await asyncio.wrap_future(self.engine.load_weights(tensors, version))

    def close(self) -> None:
        """Stop this host's threads (the worker is closing)."""
