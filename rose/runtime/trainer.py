"""The policy in training mode on the trainer worker: model, optimizer, one GRPO step per RL step.

The model lives on the worker's device: its CUDA device where it has one, the CPU otherwise. Master
weights, gradients and AdamW state are float32; forward and backward passes run under bf16 autocast
where `GRPOConfig.compute_dtype` says so ("auto": where the device computes bf16 natively). A step runs
in micro-batches under `GRPOConfig.max_tokens_per_microbatch` (rose/runtime/microbatch.py), gradients
accumulated, one optimizer step per inner epoch."""
from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from rose.config import GRPOConfig
from rose.runtime.dapo import overlong_penalty, varied_groups
from rose.runtime.engine.dtype import choose_dtype, native_bf16
from rose.runtime.grpo import group_advantages, grpo_loss, token_logprobs
from rose.runtime.sharding import (all_reduce, full_checkpoint_state, full_state_dict, load_optimizer_state,
                                   rank_passes, shard, world_and_rank)
from rose.runtime.trajectory import flat_tokens

TRAINER_STATE = "trainer.pt"  # in a checkpoint directory, beside the model's files
# Passes at most this many tokens wide run attention on PyTorch's math kernel under bf16 autocast on a
# CPU. The CPU flash-attention kernel's bf16 backward has a large fixed cost: forward + backward of a
# causal attention (4 heads of 32) on one Zen 5 core (AVX512-BF16), bf16 flash against math: 28 vs 8 ms
# at 128 x 30 tokens, 31 vs 14 at 64 x 64, 33 vs 22 at 32 x 128, 30 vs 42 at 16 x 256, 45 vs 113 at
# 8 x 512. The math kernel holds (rows, heads, width, width) scores, which stays small at these widths.
CPU_MATH_ATTENTION_MAX = 128


def _pad(values: np.ndarray, offsets: np.ndarray, pad, dtype) -> torch.Tensor:
    """Flat Arrow values + offsets -> (B, T_max) tensor, right-padded."""
    with warnings.catch_warnings():  # Arrow buffers are read-only; we only read them
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(np.asarray(values))  # zero-copy where Arrow gave a view
    lengths = np.diff(offsets)
    out = torch.full((len(lengths), int(lengths.max(initial=1))), pad, dtype=dtype)
    for i, (s, n) in enumerate(zip(offsets[:-1], lengths)):
        out[i, :n] = flat[s : s + n]
    return out


class Trainer:
    """Holds fp32 weights and AdamW state; `step` applies GRPO to one batch of trajectories."""

    def __init__(self, model_dir: str, seed: int = 0, temperature: float = 1.0, device: str | None = None):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model_dir = model_dir
        # The worker's device: its current CUDA device where there is one (a sharded trainer's rank set it
        # when it joined the group), else the CPU.
        if device is None:
            device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        # Ranks of a process group (rose/runtime/sharding.py): each holds 1/world of the model (FSDP2).
        self.world, self.rank = world_and_rank()
        if self.world > 1:
            shard(self.model, self.device)
        self.model.eval()
        self.temperature = temperature  # of the behaviour policy; the trainer scores at the same
        self.version = 0  # weights version the trainer holds; engines start at 0 too
        self.opt: torch.optim.Optimizer | None = None
        self._opt_state: dict | None = None  # a checkpoint's optimizer state, loaded when `opt` is made
        self._opt_by_name = False  # that state is keyed by parameter name (a sharded trainer's), not index
        self.pad_id = self.model.config.pad_token_id or 0
        self._native_bf16: bool | None = None  # whether self.device computes bf16 natively; asked once
        # The reference policy of GRPOConfig.kl_coef: the run's starting weights (`model_dir`; a restored
        # trainer's too), frozen. Loaded at the first step that asks for it.
        self._reference = None

    def save(self, path: str) -> None:
        """Write everything the next step depends on into the (new, empty) directory `path`: the weights
        as a model directory (config, safetensors, tokenizer: engines and `from_pretrained` load it as
        is) and `trainer.pt` (optimizer state, RNG state, weight version). Sharded: a collective every
        rank calls; rank 0 gathers the whole state and writes it, as one trainer would."""
        if self.world > 1:
            weights, opt_state = full_checkpoint_state(self.model, self.opt)
            if self.rank != 0:
                return
            by_name = opt_state is not None or self._opt_by_name
            opt_state = opt_state if opt_state is not None else self._opt_state
        else:
            weights, by_name = None, self._opt_by_name and self.opt is None
            opt_state = self.opt.state_dict() if self.opt is not None else self._opt_state
        self.model.save_pretrained(path, safe_serialization=True, state_dict=weights)
        for name in os.listdir(self.model_dir):  # the tokenizer's files, and anything else not weights
            src = os.path.join(self.model_dir, name)
            if os.path.isfile(src) and not os.path.exists(os.path.join(path, name)) and not name.endswith(
                    (".safetensors", ".bin", ".safetensors.index.json", ".rose-complete")):
                shutil.copy2(src, path)
        torch.save({"optimizer": opt_state, "optimizer_by_name": by_name, "torch_rng": torch.get_rng_state(),
                    "version": self.version}, os.path.join(path, TRAINER_STATE))

    def restore(self, path: str) -> None:
        """Continue from a directory `save` wrote: the same weights, optimizer state, RNG and version."""
        from transformers import AutoModelForCausalLM

        state = torch.load(os.path.join(path, TRAINER_STATE), weights_only=False, map_location="cpu")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device)
        if self.world > 1:
            shard(self.model, self.device)
        self.model.eval()
        self.opt, self._opt_state = None, state["optimizer"]
        self._opt_by_name = bool(state.get("optimizer_by_name", False))
        torch.set_rng_state(state["torch_rng"])
        self.version = int(state["version"])

    def step(self, table: pa.Table, cfg: GRPOConfig) -> dict:
        """One GRPO update on the trajectories in `table` (failed ones are skipped). Returns metrics."""
        t0 = time.perf_counter()
        if self.opt is None:
            if cfg.gradient_checkpointing:
                self.model.gradient_checkpointing_enable()
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=0.0)
            if self._opt_state is not None:  # restored: AdamW's moments and step counts as they were
                load_optimizer_state(self.model, self.opt, self._opt_state, self._opt_by_name)
                self._opt_state = None
        # The rate from the config at every update (a restored optimizer state carries the saved one), by
        # updates made so far: the trainer's version, which a checkpoint keeps.
        lr = cfg.lr_at(self.version)
        for group in self.opt.param_groups:
            group["lr"] = lr
        ok, metrics = _trainable(table, cfg)
        metrics["lr"] = lr
        if ok.num_rows == 0:  # every trajectory failed (or no group varied): nothing to learn, the version stays
            return metrics | {"train_s": time.perf_counter() - t0, "weight_version": self.version}
        token_ids, offsets = flat_tokens(ok, "token_ids")
        ids = _pad(token_ids, offsets, self.pad_id, torch.long)
        mask = _pad(*flat_tokens(ok, "loss_mask"), False, torch.bool).float()
        behav = _pad(*flat_tokens(ok, "logprobs"), 0.0, torch.float32)
        shaped = ok["reward"].to_numpy() + overlong_penalty(mask.sum(1).numpy(), cfg.overlong_max_tokens,
                                                            cfg.overlong_buffer, cfg.overlong_penalty)
        metrics["overlong_penalty"] = float(np.mean(shaped - ok["reward"].to_numpy()))
        rewards = torch.from_numpy(shaped.astype(np.float32))
        groups = torch.from_numpy(ok["group_id"].to_numpy().astype(np.int64))
        adv = group_advantages(rewards, groups, cfg.adv_eps)
        lengths = np.diff(offsets)
        # Each pass's loss is its own mean, weighted by its share of the batch's tokens (token
        # aggregation) or trained rows (sequence): the passes' gradients add up to the batch's.
        trained = mask.sum(1).numpy()
        passes = rank_passes(lengths, trained if cfg.aggregation == "token" else (trained > 0), self.world,
                             self.rank, cfg.max_tokens_per_microbatch)
        n_tokens = max(float(mask.sum()), 1.0)
        metrics |= {"microbatches": len(passes), "zero_adv_groups": float((adv == 0).float().mean())}

        if self._native_bf16 is None:
            self._native_bf16 = native_bf16(self.device.type)
        dtype = choose_dtype(cfg.compute_dtype, [self._native_bf16])
        reference = self._reference_model() if cfg.kl_coef > 0 else None
        self.model.train()
        losses, stats, old, ref = [], {}, [None] * len(passes), [None] * len(passes)
        mismatch, mismatch_max = 0.0, 0.0
        for epoch in range(cfg.inner_epochs):
            self.opt.zero_grad()
            epoch_loss, stats = 0.0, {}
            for k, (rows, share) in enumerate(passes):
                width = int(lengths[rows].max())
                mb_ids, mb_mask, mb_behav, mb_adv = (x.to(self.device) for x in (
                    ids[rows, :width], mask[rows, :width], behav[rows, :width], adv[rows]))
                with self._autocast(dtype, width):
                    logits = self.model(input_ids=mb_ids).logits
                lp = token_logprobs(logits, mb_ids, self.temperature)
                if epoch == 0:
                    # The first epoch's forward runs at the weights the batch started from: its log-probs
                    # are the "old" ones of the PPO ratio (no separate no-grad forward pass).
                    old[k] = lp.detach()
                    if reference is not None:
                        with torch.no_grad(), self._autocast(dtype, width):
                            ref[k] = token_logprobs(reference(input_ids=mb_ids).logits, mb_ids, self.temperature)
                    if share:
                        diff = (old[k] - mb_behav).abs() * mb_mask
                        mismatch += float(diff.sum())
                        mismatch_max = max(mismatch_max, float(diff.max()))
                loss, mb_stats = grpo_loss(lp, old[k], mb_behav, mb_adv, mb_mask, cfg.clip, cfg.tis_cap,
                                           cfg.clip_upper, cfg.aggregation, ref[k], cfg.kl_coef)
                (loss * share).backward()
                epoch_loss += loss.item() * share / self.world
                tokens = float(mb_mask.sum()) / n_tokens if share else 0.0  # stats are token means
                stats = {n: stats.get(n, 0.0) + v * tokens for n, v in mb_stats.items()}
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.opt.step()
            losses.append(epoch_loss)
        self.model.eval()
        self.version += 1
        names = sorted(stats)
        summed = all_reduce([mismatch, *losses, *(stats[n] for n in names)], self.device)
        stats = dict(zip(names, summed[1 + len(losses):]))
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        metrics |= {"logprob_mismatch": summed[0] / n_tokens,
                    "logprob_mismatch_max": all_reduce([mismatch_max], self.device, "max")[0]}
        return metrics | stats | {"loss": float(np.mean(summed[1:1 + len(losses)])), "grad_norm": float(grad_norm),
                                  "train_s": time.perf_counter() - t0, "weight_version": self.version}

    def _reference_model(self):
        """The frozen reference policy (GRPOConfig.kl_coef): `model_dir`'s weights, sharded as the model is."""
        if self._reference is None:
            from transformers import AutoModelForCausalLM

            ref = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(self.device)
            ref.requires_grad_(False)
            if self.world > 1:
                shard(ref, self.device)
            self._reference = ref.eval()
        return self._reference

    def full_state_dict(self) -> dict:
        """Every weight whole (sharded: gathered onto rank 0, the others get {}; a collective every rank calls)."""
        return full_state_dict(self.model) if self.world > 1 else self.model.state_dict()

    def _autocast(self, dtype: str, width: int):
        """The context of one pass `width` tokens wide: bf16 autocast where `dtype` is "bfloat16" (on a
        CPU, attention on the math kernel up to CPU_MATH_ATTENTION_MAX tokens), nothing in float32."""
        if dtype != "bfloat16":
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        if self.device.type == "cpu" and width <= CPU_MATH_ATTENTION_MAX:
            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        return stack


def _trainable(table: pa.Table, cfg: GRPOConfig) -> tuple[pa.Table, dict]:
    """The rows a step trains on: those that did not fail and, with dynamic sampling, only those of
    groups whose rewards vary (`varied_groups`). Returns (rows, metrics)."""
    ok = table.filter(pc.not_equal(table["finish_reason"], "failed"))
    groups = ok["group_id"].to_numpy()
    metrics = {"groups_sampled": len(np.unique(table["group_id"].to_numpy()))}
    kept = varied_groups(groups, ok["reward"].to_numpy(), np.ones(ok.num_rows, dtype=bool))
    metrics["groups_varied"] = len(kept)
    if cfg.samples_dynamically:
        ok = ok.filter(pa.array(np.isin(groups, sorted(kept))))
    metrics["trained_trajectories"] = ok.num_rows
    return ok, metrics
