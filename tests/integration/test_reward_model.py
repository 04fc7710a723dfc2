"""A reward worker (`--rose-role reward`) scores trajectories with its sequence-classification model, for
the reward op's `rose.RewardModel`; a cluster without one is a clear error before any work."""
import pytest

import rose
from rose.errors import ConfigError, ModelError
from rose.ops.reward_shapes import response
from tests.integration.helpers import small_pipeline

pytestmark = pytest.mark.integration


def build_reward_model(path: str, num_labels: int = 1) -> str:
    """A small Llama sequence classifier (one label) with the guess policy's tokenizer, seeded."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    from rose.envs import env_class
    from rose.models import prepare_model

    policy = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    tok = AutoTokenizer.from_pretrained(policy)
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=32, num_labels=num_labels,
                      pad_token_id=tok.pad_token_id, max_position_embeddings=256)
    LlamaForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def score_alone(model_dir: str, texts: list[str]) -> list[float]:
    """The model's score of each text, one at a time (no padding): what batching must not change."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(**tok(t, return_tensors="pt")).logits[0, 0].item() for t in texts]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    return build_reward_model(str(tmp_path_factory.mktemp("rm") / "reward-model"))


def test_a_reward_worker_scores_the_trajectories_in_batches(reward_model_dir):
    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster

    cfg = rose.ClusterConfig(num_dedicated=1, num_reward=1, reward_model=reward_model_dir)
    rewards = {"judge": rose.RewardModel(), "paid": (lambda batch: batch.column("env_reward").to_pylist(), 0.5)}
    p = small_pipeline("guess", groups=3, group_size=6, steps=1, reward_fn=rewards)
    with LocalRoseCluster(cfg, rose.EngineConfig(dtype="float32")) as c, Client(c) as client:
        report = rose.run(p, cluster=client, progress=False)
    rows = report.trajectories.to_pylist()
    assert report.summary["failed"] == 0 and len(rows) == 18
    want = score_alone(reward_model_dir, [r["prompt"] + response(r["actions"], r["observations"]) for r in rows])
    for r, w in zip(rows, want):
        terms = dict(r["reward_terms"])
        assert terms["judge"] == pytest.approx(w, abs=1e-4)  # batched with padding on the worker, alone here
        assert r["reward"] == pytest.approx(w + 0.5 * r["env_reward"], abs=1e-4)
    assert len({round(w, 4) for w in want}) > 1  # the texts differ, and so do their scores
    assert "reward/judge" in report.metrics.columns


def test_without_a_reward_worker_the_run_stops_before_any_work_saying_how_to_start_one(cluster):
    p = small_pipeline("guess", groups=1, group_size=2, steps=1, reward_fn=rose.RewardModel())
    with pytest.raises(ConfigError, match="no reward worker.*--rose-role reward --rose-reward-model DIR"):
        rose.run(p, cluster=cluster, progress=False)


def test_a_model_that_is_not_a_one_label_classifier_is_refused(tmp_path):
    import asyncio

    from rose.runtime.worker.reward_host import RewardHost

    two = build_reward_model(str(tmp_path / "two-labels"), num_labels=2)
    missing = str(tmp_path / "missing")
    for d, words in ((two, "has 2 labels; a reward model scores with one"),
                     (missing, "does not load as a sequence-classification")):
        with pytest.raises(ModelError, match=words):
            asyncio.run(RewardHost("w", None, d).start())
