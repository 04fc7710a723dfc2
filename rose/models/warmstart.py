"""Supervised warm start on synthetic environment demonstrations, cached on disk.

RL from a random tiny model never sees a well-formed turn, so the default pipelines first teach
the format (and weak, valid play) with a short supervised phase: next-token loss on policy tokens
only. The result is keyed by everything that shapes it and cached, so reruns skip it.
"""
from __future__ import annotations

import random

import torch
from tqdm.auto import tqdm


def encode_demo(tokenizer, segments: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """(text, is_policy) segments -> token ids and a 0/1 mask of policy tokens, built as the agent loop
    builds a rollout's ids (`rose.models.turns`: plain text, or the tokenizer's chat template). The first
    segment is the environment's first observation; an environment segment answers the turn before it."""
    from rose.models.turns import turn_format

    fmt = turn_format(tokenizer)
    if not segments or segments[0][1]:
        raise ValueError(f"a demonstration starts with the environment's first observation, got {segments[:1]!r}")
    ids = fmt.prompt(segments[0][0])
    mask = [0] * len(ids)
    rest = segments[1:]
    for i, (text, is_policy) in enumerate(rest):
        if not is_policy:
            continue  # an answer: appended with the turn before it
        gen = fmt.action(text)
        answered = i + 1 < len(rest) and not rest[i + 1][1]
        observation = rest[i + 1][0] if answered else ""
        done = not any(p for _, p in rest[i + 1:])
        tail = fmt.after(gen, observation, done)
        ids += gen + tail
        mask += [1] * len(gen) + [0] * len(tail)
    return ids, mask


def warm_start(model, tokenizer, env_cls, steps: int, batch: int, lr: float, seed: int = 0,
               progress: bool = True) -> list[float]:
    """Train `model` in place; returns the loss curve (one value per step)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    losses = []
    model.train()
    bar = tqdm(range(steps), desc=f"warm start ({env_cls.name})", disable=not progress, leave=False)
    for s in bar:
        for g in opt.param_groups:  # linear warm-up over the first 20 steps
            g["lr"] = lr * min(1.0, (s + 1) / 20)
        demos = [encode_demo(tokenizer, env_cls.demonstration(rng)) for _ in range(batch)]
        length = max(len(d[0]) for d in demos)
        ids = torch.full((batch, length), pad, dtype=torch.long)
        mask = torch.zeros((batch, length))
        for i, (d_ids, d_mask) in enumerate(demos):
            ids[i, : len(d_ids)] = torch.tensor(d_ids)
            mask[i, : len(d_mask)] = torch.tensor(d_mask, dtype=torch.float)
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None]).squeeze(2)
        loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return losses
