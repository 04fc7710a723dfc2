"""The engines' dtype when EngineConfig says "auto" (rose/runtime/engine/dtype.py)."""
import pytest

from rose.config import EngineConfig
from rose.errors import ConfigError
from rose.runtime.engine.dtype import choose_dtype, engine_dtype, native_bf16


def test_auto_is_bf16_only_where_every_rollout_device_computes_it_natively():
    assert choose_dtype("auto", [True, True]) == "bfloat16"
    assert choose_dtype("auto", [True, False, True]) == "float32"  # one engine would emulate it: all f32
    assert choose_dtype("auto", []) == "float32"  # nothing known: the dtype every device computes


def test_an_explicit_dtype_is_kept_whatever_the_devices():
    assert choose_dtype("bfloat16", [False]) == "bfloat16"
    assert choose_dtype("float32", [True]) == "float32"


def test_an_unknown_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="float16"):
        choose_dtype("float16", [True])
    with pytest.raises(ConfigError, match="EngineConfig.dtype='float16'"):
        EngineConfig(dtype="float16")


def test_a_process_given_auto_decides_for_its_own_device():
    assert EngineConfig().dtype == "auto"
    assert engine_dtype(EngineConfig()) == ("bfloat16" if native_bf16() else "float32")
    assert engine_dtype(EngineConfig(dtype="bfloat16")) == "bfloat16"
