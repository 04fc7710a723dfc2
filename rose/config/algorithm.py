"""The training algorithm's config: GRPO, and DAPO as GRPO with its four changes (`algorithm="dapo"`).
Frozen, validated on construction; errors name the field, the value and what is allowed."""
from __future__ import annotations

import math
from dataclasses import dataclass

from rose.errors import config_check, positive_check

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
    # Updates after the warm-up over which the learning rate falls along a half cosine from `lr` to
    # `lr * lr_final_ratio`, where it then stays: late updates, on a policy near its plateau, move it
    # least. 0: `lr` throughout.
    lr_decay_steps: int = 0
    lr_final_ratio: float = 0.1  # the learning rate after the decay, as a fraction of `lr`
    betas: tuple[float, float] = (0.9, 0.99)
    clip: float = 0.2  # PPO ratio clip: ratio in [1 - clip, 1 + clip_high]
    inner_epochs: int = 4  # clipped updates per batch of trajectories
    grad_clip: float = 1.0  # max global grad norm
    adv_eps: float = 1e-4  # advantage = (r - mean_group) / (std_group + adv_eps)
    tis_cap: float = 2.0  # truncated importance weight cap for engine/trainer log-prob mismatch
    # Weight of the KL penalty to the reference policy, the run's starting weights (the GRPO paper's
    # beta: 0.04 there): per generated token, kl_coef * k3(ref || policy), k3 = exp(r) - r - 1 with
    # r = ref_lp - lp, aggregated as the policy loss is. It anchors what the starting policy already does
    # well (a warm-started model's action format) while the advantages move the rest. 0: no penalty, and
    # no reference copy of the model is held (it costs one more copy of the weights and a forward pass
    # per micro-batch per step).
    kl_coef: float = 0.0
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
        positive_check(c, "lr", self.lr)
        config_check(isinstance(self.lr_warmup_steps, int) and self.lr_warmup_steps >= 0, c, "lr_warmup_steps",
                     self.lr_warmup_steps, "an int >= 0 (0: no warm-up)")
        config_check(isinstance(self.lr_decay_steps, int) and self.lr_decay_steps >= 0, c, "lr_decay_steps",
                     self.lr_decay_steps, "an int >= 0 (0: no decay)")
        config_check(isinstance(self.lr_final_ratio, (int, float)) and 0 <= self.lr_final_ratio <= 1, c,
                     "lr_final_ratio", self.lr_final_ratio, "in [0, 1]")
        config_check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), c, "betas", self.betas,
                     "two values in [0, 1)")
        config_check(0 < self.clip < 1, c, "clip", self.clip, "in (0, 1)")
        positive_check(c, "inner_epochs", self.inner_epochs)
        positive_check(c, "grad_clip", self.grad_clip)
        positive_check(c, "adv_eps", self.adv_eps)
        config_check(self.tis_cap >= 1, c, "tis_cap", self.tis_cap, ">= 1")
        positive_check(c, "kl_coef", self.kl_coef, allow_zero=True)
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
        positive_check(c, "overlong_penalty", self.overlong_penalty, allow_zero=True)
        config_check(self.max_tokens_per_microbatch is None or (isinstance(self.max_tokens_per_microbatch, int)
                                                                and self.max_tokens_per_microbatch >= 1),
                     c, "max_tokens_per_microbatch", self.max_tokens_per_microbatch, "None or an int >= 1")
        config_check(isinstance(self.gradient_checkpointing, bool), c, "gradient_checkpointing",
                     self.gradient_checkpointing, "True or False")
        config_check(self.compute_dtype in COMPUTE_DTYPES, c, "compute_dtype", self.compute_dtype,
                     f"one of {COMPUTE_DTYPES}")

    def lr_at(self, update: int) -> float:
        """The learning rate of update `update` (0 for the first): the warm-up's ramp, then `lr`, or the
        cosine decay to `lr * lr_final_ratio` where `lr_decay_steps` asks for one."""
        if update < self.lr_warmup_steps:
            return self.lr * (update + 1) / self.lr_warmup_steps
        if not self.lr_decay_steps:
            return self.lr
        done = min(1.0, (update - self.lr_warmup_steps) / self.lr_decay_steps)
        return self.lr * (self.lr_final_ratio + (1 - self.lr_final_ratio) * 0.5 * (1 + math.cos(math.pi * done)))

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
