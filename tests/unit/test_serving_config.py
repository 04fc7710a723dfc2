"""A serving worker's engines are configured, not assumed: the serving engine's settings and the device
memory split between it and the rollout engine come from the worker's flags, checked at start."""
import pytest

from rose.config import EngineConfig
from rose.errors import ConfigError
from rose.runtime.coserve.host import ServingConfig, check_device_split, serving_engine_settings
from rose.worker import dask_setup


def test_serving_engine_settings_parse_into_an_engine_config():
    engine, max_len = serving_engine_settings("dtype=float32, max_num_seqs=32,gpu_memory_utilization=0.4,"
                                              "max_model_len=4096")
    assert engine == EngineConfig(dtype="float32", max_num_seqs=32, gpu_memory_utilization=0.4)
    assert max_len == 4096
    assert serving_engine_settings(None) == (EngineConfig(), None)


@pytest.mark.parametrize("text, says", [("dtype", "not KEY=VALUE"), ("speed=3", "not KEY=VALUE"),
                                        ("max_num_seqs=lots", "is not a number"),
                                        ("dtype=float16", "dtype='float16' is not allowed")])
def test_bad_serving_engine_settings_say_what_is_wrong(text, says):
    with pytest.raises(ConfigError, match=says):
        serving_engine_settings(text)


def test_the_two_engines_split_one_device():
    run = EngineConfig(gpu_memory_utilization=0.5)
    cfg = ServingConfig("m", engine=EngineConfig(gpu_memory_utilization=0.5), rollout_gpu_memory=0.3)
    assert cfg.rollout_engine(run).gpu_memory_utilization == 0.3
    assert ServingConfig("m").rollout_engine(run) is run  # no share set: the run's own
    with pytest.raises(ConfigError, match="share one device: together at most 0.95"):
        ServingConfig("m", engine=EngineConfig(gpu_memory_utilization=0.7), rollout_gpu_memory=0.3)
    with pytest.raises(ConfigError, match="rollout_gpu_memory"):
        ServingConfig("m", rollout_gpu_memory=1.5)
    check_device_split(0.5, 0.45)
    with pytest.raises(ConfigError):
        check_device_split(0.5, 0.5)  # the run's default fraction next to a serving engine's default


def test_the_worker_takes_the_engine_flags():
    ctx = dask_setup.make_context("dask_setup", ["--rose-role", "serving", "--rose-serving-engine",
                                                 "gpu_memory_utilization=0.6", "--rose-rollout-gpu-memory", "0.3"])
    assert ctx.params["rose_serving_engine"] == "gpu_memory_utilization=0.6"
    assert ctx.params["rose_rollout_gpu_memory"] == 0.3
