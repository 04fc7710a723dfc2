"""GRPO: group-normalised advantages and the clipped, importance-corrected policy loss. Pure torch.

Three log-probs meet here, per generated token:
- `behav_lp`: from the engine that sampled the token (vLLM), recorded in the trajectory;
- `old_lp`: the trainer's own log-prob at the same weights, before this batch's updates;
- `lp`: the trainer's log-prob now, during the inner updates.
The PPO ratio `exp(lp - old_lp)` is clipped as usual. Engine and trainer compute the same policy
with different kernels, so `old_lp != behav_lp` slightly; the truncated importance weight
`min(exp(old_lp - behav_lp), tis_cap)` corrects for that mismatch (samples came from the engine)
without letting a rare large mismatch blow up the gradient. With a KL penalty (`GRPOConfig.kl_coef`) a
fourth, `ref_lp`, is the reference policy's (the run's starting weights), which the penalty pulls toward.
"""
from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """(B,) rewards, (B,) group ids -> (B,) advantages (r - mean_g) / (std_g + eps).

    A group of one has advantage 0. Std is the unbiased sample std, as in the GRPO paper.
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx].float()
        if r.numel() < 2:
            continue
        adv[idx] = (r - r.mean()) / (r.std() + eps)
    return adv


def grpo_loss(lp: torch.Tensor, old_lp: torch.Tensor, behav_lp: torch.Tensor, adv: torch.Tensor,
              mask: torch.Tensor, clip: float, tis_cap: float, clip_high: float | None = None,
              agg: str = "token", ref_lp: torch.Tensor | None = None,
              kl_coef: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The clipped policy loss over generated tokens.

    lp, old_lp, behav_lp, mask: (B, T) aligned per token; adv: (B,). mask is 1 on policy tokens. The
    ratio is clipped to [1 - clip, 1 + clip_high] (clip_high None: clip; DAPO's clip-higher raises it
    so unlikely tokens can still gain mass). agg "token": the mean over every generated token of the
    batch (long answers weigh by their length: DAPO); "sequence": each row's token mean, then the mean
    over rows. With `kl_coef` > 0, `ref_lp` (B, T) holds the reference policy's log-probs and each token's
    objective loses kl_coef * k3, k3 = exp(ref_lp - lp) - (ref_lp - lp) - 1 (>= 0, 0 where the two agree;
    the GRPO paper's estimator of KL(policy || ref)). Returns (loss, stats) where stats holds clip
    fraction, mean truncated importance weight and, with the penalty, the token mean of k3 ("kl").
    """
    high = clip if clip_high is None else clip_high
    mask = mask.float()
    zero = torch.zeros_like(lp)
    lp = torch.where(mask > 0, lp, zero)  # keep -inf or junk off masked slots
    old_lp = torch.where(mask > 0, old_lp, zero).detach()
    behav_lp = torch.where(mask > 0, behav_lp, zero)
    ratio = torch.exp(lp - old_lp)
    a = adv[:, None]
    obj = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + high) * a)
    tis = torch.clamp(torch.exp(old_lp - behav_lp), max=tis_cap).detach()
    per_token = obj * tis
    kl = None
    if kl_coef > 0:
        if ref_lp is None:
            raise ValueError("grpo_loss: kl_coef > 0 needs the reference policy's log-probs (ref_lp)")
        r = torch.where(mask > 0, ref_lp.detach(), zero) - lp
        kl = torch.exp(r) - r - 1
        per_token = per_token - kl_coef * kl
    n = mask.sum().clamp(min=1)
    if agg == "sequence":
        rows = mask.sum(1)
        per_row = (per_token * mask).sum(1) / rows.clamp(min=1)
        loss = -per_row[rows > 0].mean() if bool((rows > 0).any()) else -(per_token * mask).sum()
    else:
        loss = -(per_token * mask).sum() / n
    with torch.no_grad():
        clipped = ((ratio < 1 - clip) | (ratio > 1 + high)).float()
        stats = {"clip_frac": float((clipped * mask).sum() / n), "tis_mean": float((tis * mask).sum() / n)}
        if kl is not None:
            stats["kl"] = float((kl * mask).sum() / n)
    return loss, stats


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits (B, T, V) for positions 0..T-1, ids (B, T) -> (B, T) log-prob of ids[t] given < t.

    Position 0 has no prediction and gets 0. Logits are divided by the sampling temperature so the
    trainer's log-probs describe the distribution the engine sampled from.
    """
    logits = logits[:, :-1].float() / temperature
    lp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None]).squeeze(2)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
