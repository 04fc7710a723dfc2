"""The trainer's micro-batches (rose/runtime/microbatch.py): the plan covers every row once within its
token budget, and a step run in micro-batches makes the same update as the whole batch at once."""
import random
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.config import GRPOConfig, ModelConfig
from rose.models.tiny import build_model, build_tokenizer
from rose.runtime.microbatch import plan_microbatches
from rose.runtime.trainer import Trainer
from rose.runtime.trajectory import Trajectory, to_batch


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 2000))
def test_every_row_once_and_each_slice_within_its_budget(lengths, budget):
    plan = plan_microbatches(np.array(lengths), budget)
    rows = np.concatenate(plan) if plan else np.array([])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    for rows in plan:
        if len(rows) > 1:  # a row alone may exceed the budget: it cannot be split
            assert len(rows) * max(lengths[i] for i in rows) <= budget


def test_no_budget_is_one_slice_and_a_bad_budget_is_refused():
    assert [r.tolist() for r in plan_microbatches(np.array([3, 1, 2]), None)] == [[0, 1, 2]]
    with pytest.raises(ValueError, match="max_tokens"):
        plan_microbatches(np.array([3]), 0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = build_tokenizer(["guess", "higher", "lower"])
    path = tmp_path_factory.mktemp("tiny")
    build_model(ModelConfig(hidden_size=64, num_heads=2), tok, seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _table(seed=0, groups=4, size=4):
    """Trajectories of varied lengths (5-40 tokens) with random policy tokens and rewards."""
    rng = random.Random(seed)
    trajs, rewards = [], []
    for g in range(groups):
        for i in range(size):
            t = Trajectory(0, g, i, "guess", g, "{}")
            t.add_context([1] + [rng.randrange(5, 60) for _ in range(rng.randrange(2, 10))])
            for _ in range(rng.randrange(1, 4)):
                n = rng.randrange(1, 8)
                t.add_generated([rng.randrange(5, 60) for _ in range(n)], [-rng.uniform(0.5, 4) for _ in range(n)],
                                [0] * n)
                t.add_context([rng.randrange(5, 60) for _ in range(rng.randrange(0, 5))])
            t.finish_reason = "done"
            trajs.append(t)
            rewards.append(rng.choice([0.0, 0.5, 1.0]))
    return pa.Table.from_batches([to_batch(trajs, rewards)])


@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_micro_batches_make_the_same_update(model_dir, agg):
    table = _table()
    whole, sliced = Trainer(model_dir, device="cpu"), Trainer(model_dir, device="cpu")
    cfg = GRPOConfig(lr=1e-3, inner_epochs=2, loss_agg=agg, compute_dtype="float32")
    m_whole = whole.step(table, cfg)
    m_sliced = sliced.step(table, replace(cfg, max_tokens_per_microbatch=60))
    assert m_whole["microbatches"] == 1 and m_sliced["microbatches"] >= 5
    for name in ("loss", "grad_norm", "clip_frac", "tis_mean", "logprob_mismatch"):
        assert m_sliced[name] == pytest.approx(m_whole[name], rel=1e-4, abs=1e-6), name
    before = Trainer(model_dir, device="cpu").model.state_dict()
    moved = 0.0
    for (name, a), b in zip(whole.model.state_dict().items(), sliced.model.state_dict().values()):
        # Summation order differs between one pass and several (and with the CPU's vector width): on an
        # AVX2 host the two updates differed by up to 2.5e-6, against steps of ~1e-3 (`moved`, below).
        assert torch.allclose(a, b, atol=1e-5), (name, (a - b).abs().max())
        moved = max(moved, float((a - before[name]).abs().max()))
    assert moved > 1e-4  # the step did change the weights: the comparison is not of two untouched models


@pytest.mark.gpu
def test_the_trainer_steps_on_the_gpu_as_on_the_cpu(model_dir):
    # bf16 autocast on CUDA against float32 on the CPU: the same update to bf16 rounding.
    table = _table(seed=1)
    cpu, gpu = Trainer(model_dir, device="cpu"), Trainer(model_dir)
    assert gpu.device.type == "cuda" and next(gpu.model.parameters()).is_cuda
    cfg = GRPOConfig(lr=1e-3, inner_epochs=2, max_tokens_per_microbatch=200, compute_dtype="float32")
    m_cpu, m_gpu = cpu.step(table, cfg), gpu.step(table, replace(cfg, compute_dtype="bfloat16"))
    assert m_gpu["microbatches"] == m_cpu["microbatches"] > 1
    assert m_gpu["logprob_mismatch"] == pytest.approx(m_cpu["logprob_mismatch"], rel=0.05)
    for (name, a), b in zip(cpu.model.state_dict().items(), gpu.model.state_dict().values()):
        assert b.dtype == torch.float32 and torch.allclose(a, b.cpu(), atol=5e-3), name


@pytest.mark.parametrize("width", [None, 400])
def test_bf16_autocast_on_the_cpu_makes_float32s_update_to_bf16_rounding(model_dir, width):
    # width 400: one row padded past CPU_MATH_ATTENTION_MAX, so its pass takes the flash-attention kernel
    table = _table(seed=2)
    if width:  # one more trajectory in group 0
        t = Trajectory(0, 0, 99, "guess", 0, "{}")
        t.add_context([1] + [7] * (width - 11))
        t.add_generated([9] * 10, [-1.0] * 10, [0] * 10)
        t.finish_reason = "done"
        table = pa.concat_tables([table, pa.Table.from_batches([to_batch([t], [1.0])])])
    f32, b16 = Trainer(model_dir, device="cpu"), Trainer(model_dir, device="cpu")
    cfg = GRPOConfig(lr=1e-3, inner_epochs=2, max_tokens_per_microbatch=300, compute_dtype="float32")
    m32, m16 = f32.step(table, cfg), b16.step(table, replace(cfg, compute_dtype="bfloat16"))
    assert m16["microbatches"] == m32["microbatches"] > 1
    assert m16["logprob_mismatch"] == pytest.approx(m32["logprob_mismatch"], rel=0.01)
    before = Trainer(model_dir, device="cpu").model.state_dict()
    w32, w16 = f32.model.state_dict(), b16.model.state_dict()
    assert all(w.dtype == torch.float32 for w in w16.values())  # master weights stay float32
    # Adam's first updates are about +-lr an element whatever the gradient's size, so elements whose tiny
    # gradients bf16 rounds the other way differ by up to twice a step: compare the updates' directions.
    u32, u16 = (torch.cat([(w[n] - b).flatten() for n, b in before.items()]) for w in (w32, w16))
    assert float(torch.nn.functional.cosine_similarity(u32, u16, dim=0)) > 0.95
    assert not torch.equal(u32, u16)  # the passes did run in bf16: float32's would make the same update to the bit


def test_auto_runs_the_passes_in_the_dtype_this_cpu_computes_natively(model_dir):
    from rose.runtime.engine.dtype import native_bf16

    table, expect = _table(seed=3), "bfloat16" if native_bf16("cpu") else "float32"
    auto, named = Trainer(model_dir, device="cpu"), Trainer(model_dir, device="cpu")
    cfg = GRPOConfig(lr=1e-3, inner_epochs=1)
    assert cfg.compute_dtype == "auto"  # the default
    auto.step(table, cfg)
    named.step(table, replace(cfg, compute_dtype=expect))
    for (name, a), b in zip(auto.model.state_dict().items(), named.model.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="compute_dtype"):
        GRPOConfig(compute_dtype="float16")
