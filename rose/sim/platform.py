"""Costs of one simulated setup, from the GPU roofline (`platform="gpu"`) or this host's measured CPU
profile (`platform="cpu"`): engine step times, training and weight-sync times, the serving fleet."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from rose.runtime.coserve.slo import SloConfig
from rose.sim.config import SimConfig
from rose.sim.costs import GPUS, MODELS, CostModel, CpuProfile, LinearCost, load_cpu_profile, train_seconds
from rose.sim.serving import RequestShape, ServingFleet, request_shape
from rose.sim.sync import SyncTimes, sync_times

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AZURE_CSV = os.path.join(ROOT, "benchmarks", "data", "azure_llm_inference_2023_conv.csv")


@lru_cache(maxsize=4)
def _shape(path: str, scale: float) -> RequestShape:
    s = request_shape(path)
    return RequestShape(s.prompt_mean * scale, s.prompt_p99 * scale, s.gen_mean * scale)


@dataclass
class Platform:
    roll: LinearCost  # a dedicated rollout instance
    fleet: ServingFleet | None  # serving instances (None: no serving GPUs)
    tp: int  # devices per instance
    cfg: SimConfig
    cpu: CpuProfile | None = None  # the measured profile, on platform "cpu"
    # Slow-down of the trainer and of rollout engines on other devices while both run (the host's
    # shared caches and memory bandwidth; 0 on GPUs, which share neither)
    contention: float = 0.0
    share: float = 0.5  # each side's speed while a trainer and a rollout engine time-share the same devices

    def train_s(self, tokens: float, trajectories: int, gpus: int) -> float:
        if self.cpu is not None:
            return self.cpu.train_base_s + self.cpu.train_s_per_traj * trajectories
        return train_seconds(GPUS[self.cfg.gpu], MODELS[self.cfg.model], tokens, gpus)

    def reload_s(self) -> float:
        """Colocated engines take the trainer's new weights on the same devices (NVLink-class copy)."""
        if self.cpu is not None:
            return self.cpu.sync_s
        return self.roll.weight_bytes / self.tp / 200e9

    def sync(self, sites: dict[str, int]) -> SyncTimes:
        if self.cpu is not None:
            return SyncTimes({s: self.cpu.sync_s for s in sites}, 0.0, 0.0)
        c = self.cfg
        return _sync_cached(tuple(sorted(sites.items())), self.roll.weight_bytes, c.intra_gbit, c.inter_gbit,
                            c.sparse_sync, c.relays, c.changed_fraction)


@lru_cache(maxsize=256)
def _sync_cached(sites, weight_bytes, intra, inter, sparse, relays, changed) -> SyncTimes:
    return sync_times(dict(sites), "job", weight_bytes, intra, inter, sparse, relays, changed)


def mean_context(cfg: SimConfig) -> float:
    """Mean KV tokens a rollout sequence holds: its prompt and half of what it generates."""
    per_turn = cfg.tokens_per_turn * math.exp(cfg.length_sigma ** 2 / 2)
    gen = min(cfg.max_tokens, per_turn * (cfg.turns_min + cfg.turns_max) / 2)
    return cfg.prompt_tokens + gen / 2


def build(cfg: SimConfig, rng: np.random.Generator, azure_csv: str = AZURE_CSV) -> Platform:
    slo = SloConfig(cfg.ttft_ms, cfg.tpot_ms, margin=cfg.slo_margin, learn_margin=cfg.slo_learn_margin,
                    max_rollout_steps=cfg.coserve_steps)
    shape = _shape(azure_csv, cfg.serving_token_scale)
    if cfg.platform == "cpu":
        prof = load_cpu_profile()
        # A dedicated worker's slots as the setup gives them (elastic_e2e: 256 for fixed's worker, 64 for a
        # colocated one); 64 for all of them made fixed's step two waves where the runs had one.
        roll = prof.linear(max_seqs=cfg.max_num_seqs)
        serve, co_roll = replace(prof.linear(max_seqs=256), max_seqs=256), replace(roll, max_seqs=128)
        # A co-served step as the serving worker's controller measured it (two engines and the worker's
        # other threads in one process on one core), where the profile has it; else the engine alone.
        if prof.coserve_rollout_ms:
            co_roll = replace(co_roll, a_ms=prof.coserve_rollout_ms[0], b_ms=prof.coserve_rollout_ms[1])
        if prof.coserve_serving_ms:
            serve = replace(serve, a_ms=prof.coserve_serving_ms[0], b_ms=prof.coserve_serving_ms[1])
        fleet = None
        if cfg.serving_gpus:
            # One core serves the tiny model next to the rollout engine; memory is not what binds here.
            fleet = ServingFleet(slo, serve, co_roll, shape, 1e12, 1e12, 1.0, 0.0, 512, rng, cfg.coserve_overhead_ms)
        return Platform(roll, fleet, 1, cfg, cpu=prof, contention=prof.contention if cfg.contention else 0.0,
                        share=0.5 * prof.sharing)
    gpu, model = GPUS[cfg.gpu], MODELS[cfg.model]
    ctx = mean_context(cfg)
    cm = CostModel(gpu, model, ctx)
    roll = cm.linear()
    roll = replace(roll, max_seqs=min(roll.max_seqs, cfg.max_num_seqs))
    fleet = None
    if cfg.serving_gpus:
        smodel = replace(MODELS[cfg.serving_model], tp=model.tp)  # serving shares the rollout instance's devices
        scm = CostModel(gpu, smodel, shape.prompt_mean + shape.gen_mean / 2)
        usable = gpu.memory_gb * model.tp * 0.9 * 1e9
        rollout_kv = usable - model.weight_bytes - smodel.weight_bytes  # bytes for both KV caches
        fleet = ServingFleet(slo, scm.linear(), roll, shape, rollout_kv, usable - smodel.weight_bytes,
                             ctx * model.kv_bytes_per_token, smodel.kv_bytes_per_token, 512, rng,
                             cfg.coserve_overhead_ms)
    return Platform(roll, fleet, model.tp, cfg)
