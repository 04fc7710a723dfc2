"""`ServingHost`: what a serving worker hosts: the co-serving executor (serving engine now, rollout engine
once a run prepares it) and the HTTP front end for online traffic.

`dask worker SCHED --preload rose.worker --rose-role serving --rose-serving-model DIR [--rose-http-port P]`
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field

from rose.config import EngineConfig
from rose.errors import ConfigError, config_check
from rose.models.loading import load_checkpoint
from rose.runtime.coserve.slo import RolloutCaps, SloConfig
from rose.runtime.engine.dtype import engine_dtype
from rose.runtime.protocol import ModelSpec
from rose.runtime.worker.host import Host

logger = logging.getLogger("rose.coserve")


@dataclass(frozen=True)
class ServingConfig:
    model_dir: str  # the serving model (Hugging Face directory); never a sync target
    http_host: str = "127.0.0.1"
    http_port: int = 0  # 0: any free port (reported in the worker's metrics)
    slo: SloConfig = field(default_factory=lambda: SloConfig(ttft_ms=1000.0, tpot_ms=100.0))
    caps: RolloutCaps = field(default_factory=RolloutCaps)  # rollout's share of this device
    engine: EngineConfig = field(default_factory=EngineConfig)  # of the serving engine
    max_model_len: int | None = None  # None: the model's own
    # GPU hosts: the device memory fraction of the rollout engine (vLLM's gpu_memory_utilization), in place
    # of the run's EngineConfig's. The serving engine takes `engine.gpu_memory_utilization`; the two share
    # one device, so together at most MAX_DEVICE_SHARE. None: the run's.
    rollout_gpu_memory: float | None = None

    def __post_init__(self):
        c = "ServingConfig"
        config_check(0 <= self.http_port < 65536, c, "http_port", self.http_port, "in [0, 65535]")
        config_check(self.rollout_gpu_memory is None or 0 < self.rollout_gpu_memory < 1, c, "rollout_gpu_memory",
                     self.rollout_gpu_memory, "None or in (0, 1)")
        if self.rollout_gpu_memory is not None:
            check_device_split(self.engine.gpu_memory_utilization, self.rollout_gpu_memory)

    def rollout_engine(self, run_engine: EngineConfig) -> EngineConfig:
        """The rollout engine's settings on this worker: the run's, with this worker's memory share."""
        if self.rollout_gpu_memory is None:
            return run_engine
        return dataclasses.replace(run_engine, gpu_memory_utilization=self.rollout_gpu_memory)


MAX_DEVICE_SHARE = 0.95  # both engines' gpu_memory_utilization together (vLLM's own default is 0.9 for one)


def check_device_split(serving: float, rollout: float) -> None:
    """Both engines' device memory fractions fit one device together, or a ConfigError naming both."""
    if serving + rollout > MAX_DEVICE_SHARE:
        raise ConfigError(f"the serving engine's gpu_memory_utilization {serving:g} and the rollout engine's "
                          f"{rollout:g} share one device: together at most {MAX_DEVICE_SHARE} "
                          f"(--rose-serving-engine gpu_memory_utilization=..., --rose-rollout-gpu-memory)")


def serving_engine_settings(text: str | None) -> tuple[EngineConfig, int | None]:
    """`--rose-serving-engine "dtype=bfloat16,max_num_seqs=64,gpu_memory_utilization=0.4,max_model_len=4096"`:
    the serving engine's EngineConfig (its fields by name) and max_model_len (None: the model's own)."""
    defaults = {f.name: getattr(EngineConfig(), f.name) for f in dataclasses.fields(EngineConfig)}
    defaults["max_model_len"] = 0  # an int, like the fields it sits beside
    kwargs = {}
    for item in filter(None, (text or "").split(",")):
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or key not in defaults:
            raise ConfigError(f"--rose-serving-engine: {item!r} is not KEY=VALUE with KEY one of {sorted(defaults)}")
        try:  # each value as the type of its field's default (EngineConfig validates the value itself)
            kwargs[key] = type(defaults[key])(value)
        except ValueError:
            raise ConfigError(f"--rose-serving-engine: {key}={value!r} is not a number") from None
    max_len = kwargs.pop("max_model_len", None)
    return EngineConfig(**kwargs), max_len


def _model_max_len(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    return int(cfg.get("max_position_embeddings") or 2048)


class ServingHost(Host):
    """The serving role's host: online traffic from the start, rollouts once a run prepares it."""

    def __init__(self, address: str, weights, cfg: ServingConfig, cores: tuple[int, ...] | None = None):
        from transformers import AutoTokenizer

        from rose.models.loading import check_model_dir
        from rose.runtime.coserve.executor import CoServingExecutor
        from rose.runtime.coserve.http import ServingFrontend
        from rose.runtime.coserve.slo import SloController
        from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

        super().__init__(address, weights, cores)
        check_model_dir(cfg.model_dir)
        self.cfg = cfg
        self.max_model_len = cfg.max_model_len or _model_max_len(cfg.model_dir)
        configure_vllm_env(cfg.engine, list(cores) if cores else None)
        self.executor = CoServingExecutor(
            lambda: VllmEngine(cfg.model_dir, cfg.engine, self.max_model_len), None,
            SloController(cfg.slo, cfg.caps), cores=cores)
        self.executor.in_flight = lambda: self.in_flight  # its offer's bound counts what the placement counts
        self.front = ServingFrontend(self.executor, AutoTokenizer.from_pretrained(cfg.model_dir),
                                     os.path.basename(cfg.model_dir.rstrip("/")), self.max_model_len, cfg.slo)
        self.rollout_key = None  # (model_dir, max_model_len, engine config) of the attached rollout engine

    @property
    def engine(self):
        """Rollout turns and synced weights go through the executor, once it has a rollout engine."""
        return self.executor if self.rollout_key is not None else None

    async def start(self) -> None:
        """Open the HTTP front end."""
        port = await self.front.start(self.cfg.http_host, self.cfg.http_port)
        logger.info("serving %s on http://%s:%d", self.front.model_name, self.cfg.http_host, port)

    def prepare(self, spec: ModelSpec) -> None:
        """Give the executor the run's rollout engine (first run), or reset it to the run's starting
        weights (the model's, or a checkpoint's when the run resumes or its trainer was replaced)."""
        import torch
        from transformers import AutoTokenizer

        from rose.runtime.engine.vllm_engine import VllmEngine

        key = (spec.model_dir, spec.max_model_len, spec.engine)
        checkpoint = load_checkpoint(spec.weights_from)
        if self.rollout_key is None:
            # On a GPU both engines share device memory (each takes its `gpu_memory_utilization`), and the
            # rollout engine sleeps when a burst needs the memory. That path is untested here (no GPU vLLM).
            gpu = torch.cuda.is_available()
            engine = self.cfg.rollout_engine(spec.engine)
            if gpu:
                check_device_split(self.cfg.engine.gpu_memory_utilization, engine.gpu_memory_utilization)
            self.executor.attach_rollout(
                lambda: VllmEngine(spec.model_dir, engine, spec.max_model_len, seed=spec.seed,
                                   sleep_mode=gpu)).result()
            self.rollout_key = key
            if spec.weights_dir is not None or spec.version != 0:  # a resumed run: the checkpoint's weights
                self.executor.load_weights(checkpoint, spec.version).result()
        elif key != self.rollout_key:
            raise ConfigError(f"serving worker {self.address}'s rollout engine runs {self.rollout_key[0]}; a run "
                              f"of {spec.model_dir} needs a new worker (in-process vLLM engines cannot be replaced)")
        else:
            self.executor.load_weights(checkpoint, spec.version).result()
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        # What the rollout engine holds, as shards: the base of the first sync's deltas.
        self.weights.reset(engine_dtype(spec.engine), spec.engine.weight_shard_bytes)
        self.weights.adopt(checkpoint, spec.version)
        self.spec = spec

    @property
    def slots(self) -> int:
        """The rollout sequences the executor can run next to its recent online traffic inside the SLO."""
        return self.executor.rollout_capacity

    def report(self) -> dict:
        return super().report() | {"http_port": self.front.port, "slo_met": self.front.slo_met,
                                   "slo_requests": self.front.requests}

    def close(self) -> None:
        self.executor.close()
