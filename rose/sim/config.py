"""One simulated setup (`SimConfig`), and the TOML files that list many (`load_matrix`).

A TOML file has a `[base]` table (fields every config shares), an optional `[matrix]` table (field ->
list of values: one config per combination) and optional `[[config]]` entries (each merged over the
base, then expanded by the matrix and by its own `matrix` table, whose fields win). Unknown fields
are errors that name the file and the field.
"""
from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, fields

from rose.errors import ConfigError, config_check

SIM_POLICIES = ("fixed_sync", "fixed_async", "elastic", "rose", "ideal")
TRACES = ("azure", "diurnal", "bursty", "flat", "none")


@dataclass(frozen=True)
class SimConfig:
    name: str = "default"
    policies: tuple[str, ...] = SIM_POLICIES  # which policies to run on this setup
    # --- hardware
    platform: str = "gpu"  # gpu: roofline costs (rose.sim.costs); cpu: this host's measured profile
    contention: bool = True  # cpu: model the two cores slowing each other down (the profile's measured figure)
    gpu: str = "H800"
    model: str = "8b"  # key of rose.sim.costs.MODELS: the policy model
    serving_model: str = "serve-7b"  # what the serving GPUs serve
    job_gpus: int = 48  # the RL job's own GPUs (trainer and dedicated rollout engines)
    serving_gpus: int = 64  # GPUs serving online traffic whose spare capacity rose may borrow
    max_num_seqs: int = 256  # rollout sequences an engine instance runs at once at most (vLLM's default)
    # Asynchronous policies: share of job_gpus that train (the rest roll out; 1: every job GPU trains and
    # rollouts run only outside the job, on serving or on-demand GPUs)
    train_fraction: float = 0.5
    # Asynchronous policies: other splits to try (each policy keeps its best: baselines are set up to win)
    train_fractions: tuple[float, ...] = ()
    # Asynchronous policies: the job's rollout engines share the trainer's devices and pause while it trains
    # (train_fraction is then ignored: every job device trains and rolls out).
    colocated: bool = False
    # --- workload
    steps: int = 20
    prompts: int = 256  # GRPO groups a step (DAPO: varied groups wanted a step)
    group_size: int = 16
    algorithm: str = "grpo"  # grpo | dapo (dynamic sampling: rounds until `prompts` groups vary)
    turns_min: int = 2
    turns_max: int = 10
    tokens_per_turn: float = 150.0  # median generated tokens of one turn
    length_sigma: float = 1.0  # lognormal sigma of a turn's length: the long tail
    max_tokens: int = 8192  # generated tokens of a trajectory at most
    prompt_tokens: int = 600  # prompt plus observations a trajectory carries (tokens)
    env_latency_s: float = 0.3  # mean environment (tool) latency a turn (s, exponential)
    # --- serving
    trace: str = "azure"  # azure (the CSV in shared/data, replayed) | diurnal | bursty | flat | none
    serving_rps: float = 8.0  # mean requests/s a serving instance receives
    serving_token_scale: float = 1.0  # multiply the trace's prompt and generated tokens (this host's tiny model)
    ttft_ms: float = 500.0
    tpot_ms: float = 150.0
    slo_margin: float = 0.15  # SloConfig.margin (the learnt margin's prior)
    slo_learn_margin: bool = True  # SloConfig.learn_margin (off: the margin stays slo_margin)
    # What a co-serving iteration costs beyond its two engine steps (the executor's own work, the HTTP
    # front end; ms): the runtime's controller learns it (`observe_iteration`) and budgets for it
    coserve_overhead_ms: float = 0.0
    coserve_steps: int = 16  # SloConfig.max_rollout_steps: rollout steps between two serving steps at most
    # --- links (Gbit/s)
    intra_gbit: float = 400.0  # each instance's NIC inside a cluster
    inter_gbit: float = 200.0  # between clusters (job <-> serving, job <-> cloud)
    # --- resource-elastic baseline
    elastic_max_gpus: int = 64  # availability cap (GPUs)
    allocation_delay_s: float = 60.0  # mean wait for an instance (s, exponential), before its cold start
    allocation_delay_fixed: bool = False  # wait exactly allocation_delay_s (a scripted delay, as in elastic_e2e)
    preempt_mean_s: float = 0.0  # mean lifetime of an on-demand instance before preemption (0: never)
    idle_release_s: float = 30.0  # an idle on-demand instance goes back after this (s)
    # --- ROSE's extensions (switches)
    staleness: int = 1  # asynchronous policies: rollouts may run this many versions behind
    # once nothing waits, the oldest groups on serving GPUs move to idle dedicated ones (the runtime's
    # ClusterConfig.migrate, off by default there too)
    migrate_tail: bool = False
    sparse_sync: bool = True  # send deltas of changed shards (else dense)
    relays: bool = True  # each shard crosses a slow link once, then fans out (else every receiver from source)
    changed_fraction: float = 0.03  # bytes of a sparse update relative to dense
    # --- simulation
    seed: int = 0
    tick_s: float = 2.0  # placement decisions at most this often (s of simulated time)
    load_tick_s: float = 30.0  # serving load and spare capacity re-read this often (s)

    def __post_init__(self):
        c = "SimConfig"
        bad = [p for p in self.policies if p not in SIM_POLICIES]
        config_check(not bad and len(self.policies) > 0, c, "policies", self.policies, f"a subset of {SIM_POLICIES}")
        config_check(self.platform in ("gpu", "cpu"), c, "platform", self.platform, "gpu | cpu")
        config_check(self.algorithm in ("grpo", "dapo"), c, "algorithm", self.algorithm, "grpo | dapo")
        config_check(self.trace in TRACES or self.trace.endswith(".csv"), c, "trace", self.trace,
                     f"one of {TRACES} or a path to an Azure-format .csv")
        for f in ("job_gpus", "coserve_steps", "max_num_seqs", "steps", "prompts", "group_size", "turns_min",
                  "max_tokens"):
            config_check(isinstance(getattr(self, f), int) and getattr(self, f) >= 1, c, f, getattr(self, f),
                         "an int >= 1")
        for f in ("serving_gpus", "elastic_max_gpus", "staleness", "seed"):
            config_check(isinstance(getattr(self, f), int) and getattr(self, f) >= 0, c, f, getattr(self, f),
                         "an int >= 0")
        config_check(self.turns_max >= self.turns_min, c, "turns_max", self.turns_max, f">= turns_min={self.turns_min}")
        for f in (self.train_fraction, *self.train_fractions):
            config_check(0 < f <= 1, c, "train_fraction(s)", f, "in (0, 1]")
        config_check(0 < self.changed_fraction <= 1, c, "changed_fraction", self.changed_fraction, "in (0, 1]")
        config_check(0 <= self.slo_margin < 1, c, "slo_margin", self.slo_margin, "in [0, 1)")
        for f in ("tokens_per_turn", "serving_token_scale", "ttft_ms", "tpot_ms", "intra_gbit", "inter_gbit", "tick_s",
                  "load_tick_s"):
            config_check(getattr(self, f) > 0, c, f, getattr(self, f), "> 0")
        for f in ("coserve_overhead_ms", "length_sigma", "prompt_tokens", "env_latency_s", "serving_rps",
                  "allocation_delay_s", "preempt_mean_s", "idle_release_s"):
            config_check(getattr(self, f) >= 0, c, f, getattr(self, f), ">= 0")


_FIELDS = {f.name: f for f in fields(SimConfig)}


def make_config(raw: dict, where: str = "config") -> SimConfig:
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; SimConfig has {sorted(_FIELDS)}")
    vals = dict(raw)
    for k in ("policies", "train_fractions"):
        if isinstance(vals.get(k), list):
            vals[k] = tuple(vals[k])
    for k, v in vals.items():
        want = type(getattr(SimConfig, k, None)) if k not in ("policies", "train_fractions") else tuple
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            vals[k] = float(v)
        elif want not in (type(None), tuple) and not isinstance(vals[k], want):
            raise ConfigError(f"{where}: field {k}={v!r} should be {want.__name__}")
    return SimConfig(**vals)


def load_matrix(path: str) -> list[SimConfig]:
    """Every config the TOML file at `path` lists, named after what varies."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"no simulation config at {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    extra = sorted(set(doc) - {"base", "matrix", "config"})
    if extra:
        raise ConfigError(f"{path}: unknown table(s) {extra}; expected [base], [matrix], [[config]]")
    base = doc.get("base", {})
    matrix = doc.get("matrix", {})
    for k, v in matrix.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{path}: [matrix] {k} must be a non-empty list, got {v!r}")
    entries = doc.get("config") or [{}]
    out = []
    for i, entry in enumerate(entries):
        entry = dict(entry)
        own = entry.pop("matrix", None) or {}
        if not isinstance(own, dict) or any(not isinstance(v, list) or not v for v in own.values()):
            raise ConfigError(f"{path}: config #{i + 1}'s matrix must map fields to non-empty lists, got {own!r}")
        mat = {**matrix, **own}
        keys = list(mat)
        for combo in itertools.product(*(mat[k] for k in keys)):
            raw = {**base, **entry, **dict(zip(keys, combo))}
            name = entry.get("name") or base.get("name") or "sim"
            varied = "-".join(f"{k}={v}" for k, v in zip(keys, combo))
            raw["name"] = f"{name}[{varied}]" if varied else name
            out.append(make_config(raw, f"{path} config #{i + 1} {raw['name']}"))
    return out
