"""The trainer sharded across ranks of a torch.distributed process group (FSDP2).

Each rank holds 1/world of every decoder layer's parameters, gradients and AdamW state
(`torch.distributed.fsdp.fully_shard`); a layer's full weights exist only while its forward or
backward runs. Every rank receives the whole batch and trains on its share of the rows
(`split_by_tokens`). FSDP averages gradients over ranks, so each rank weights its loss by world x its
share of the batch: the sum is the batch's loss, as one trainer computes it.

FSDP's forward and backward passes are collective: every rank must run the same number of them.
Each rank computes every rank's micro-batch plan (they all see the same batch) and pads its own to the
longest with passes of zero weight.
"""
from __future__ import annotations

import numpy as np


def split_by_tokens(lengths: np.ndarray, world: int) -> list[np.ndarray]:
    """Rows of each rank (every row exactly once), balanced by tokens: longest first, each to the rank
    with the fewest tokens so far (ties: the lowest rank). Deterministic, so every rank computes it
    alike. `lengths`: (B,) tokens per row."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    lengths = np.asarray(lengths, dtype=np.int64)
    load = np.zeros(world, dtype=np.int64)
    rows: list[list[int]] = [[] for _ in range(world)]
    for i in np.argsort(-lengths, kind="stable"):
        r = int(np.argmin(load))
        rows[r].append(int(i))
        load[r] += lengths[i]
    return [np.array(sorted(r), dtype=np.int64) for r in rows]


def rank_passes(lengths: np.ndarray, weights: np.ndarray, world: int, rank: int,
                max_tokens: int | None) -> list[tuple[np.ndarray, float]]:
    """This rank's forward/backward passes: (rows, loss weight) each. Rows are the rank's share of the
    batch (`split_by_tokens`) in micro-batches (`plan_microbatches`); a pass's loss weight is world x its
    share of the batch's `weights` (per row: tokens trained on, or 1 per trained row), so that the
    gradients FSDP averages over ranks add up to the batch's. Every rank gets as many passes as the
    busiest: the missing ones repeat a row at weight 0."""
    from rose.runtime.microbatch import plan_microbatches

    weights = np.asarray(weights, dtype=np.float64)
    total = max(float(weights.sum()), 1.0)
    parts = split_by_tokens(lengths, world)
    plans = [[part[p] for p in plan_microbatches(np.asarray(lengths)[part], max_tokens)] if len(part) else []
             for part in parts]
    mine = [(rows, world * float(weights[rows].sum()) / total) for rows in plans[rank]]
    idle = (np.array([0], dtype=np.int64), 0.0)
    return mine + [idle] * (max(len(p) for p in plans) - len(mine))


def world_and_rank() -> tuple[int, int]:
    """(world size, rank) of the default process group; (1, 0) when there is none."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def shard(model, device) -> None:
    """Shard `model` in place over the default process group: each decoder layer, then the rest."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world, _ = world_and_rank()
    mesh = init_device_mesh(device.type, (world,))
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"cannot shard {type(model).__name__}: expected decoder layers at model.model.layers")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _gathered():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Whole tensors, on rank 0's CPU only: the other ranks never hold the full model.
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dict(model) -> dict:
    """Every parameter whole on rank 0 (the other ranks get an empty dict). A collective: all ranks call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_gathered())


def all_reduce(values: list[float], device, op: str = "sum") -> list[float]:
    """`values` reduced over the ranks ("sum" or "max"; a collective); as given without a process group."""
    import torch
    import torch.distributed as dist

    world, _ = world_and_rank()
    if world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.tolist()


def full_checkpoint_state(model, opt) -> tuple[dict, dict | None]:
    """(model state, AdamW state keyed by parameter name), each whole, on rank 0; the other ranks get
    empty dicts. A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    opt_state = get_optimizer_state_dict(model, opt, options=_gathered()) if opt is not None else None
    return full_state_dict(model), opt_state


def load_optimizer_state(model, opt, state: dict, by_name: bool) -> None:
    """A checkpoint's AdamW state into `opt` (on every rank: each keeps its own shard), whichever way it
    was written: keyed by parameter name (a sharded trainer's checkpoint, `by_name`) or by index (one
    trainer's `opt.state_dict()`, whose order is `model.parameters()`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    world, _ = world_and_rank()
    if not by_name and world == 1:
        opt.load_state_dict(state)
        return
    if not by_name:
        names = [n for n, _ in model.named_parameters()]
        state = {"state": {names[i]: s for i, s in state["state"].items()},
                 "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True))
