"""Reward functions in verl's and TRL's shapes, and several weighed into one reward."""
import math

import numpy as np
import pyarrow as pa
import pytest

import rose
from rose.errors import ConfigError, GraphError
from rose.graph import rl_step
from rose.graph.validate import validate_step
from rose.ops.reward import apply_reward
from rose.ops.reward_shapes import Reward, Rewards, response, shape_of
from rose.report import term_means
from rose.runtime.trajectory import TRAJECTORY_SCHEMA, Trajectory, to_batch, upgrade


def _batch(answers=("guess 3 \n", "guess 9 \n", "guess 5 \n"), failed=()):
    trajs = []
    for i, a in enumerate(answers):
        t = Trajectory(2, 1, i, "guess", 7, '{"high": 16}', env_reward=0.5 * i)
        t.prompt, t.ground_truth = "find 1 16\n", "9"
        t.add_context([1, 2])
        t.add_generated([3, 4], [-0.1, -0.2], [0, 0])
        t.actions, t.observations = [a], ["lower \n"]
        if i in failed:
            t.finish_reason, t.error = "failed", "boom"
        trajs.append(t)
    return to_batch(trajs)


def _rows(batch):
    return {r["trajectory_id"]: r for r in batch.to_pylist()}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A verl-style scorer: 1 if the guess is the ground truth."""
    return float(solution_str.split()[1] == ground_truth)


def test_a_verl_compute_score_is_called_once_per_trajectory_with_verls_arguments():
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return {"score": compute_score(data_source, solution_str, ground_truth), "acc": 1}

    assert shape_of(score) == "verl"
    out = apply_reward(_batch(), score)
    assert out.column("reward").to_pylist() == [0.0, 1.0, 0.0]
    ds, sol, gt, extra = seen[1]
    assert (ds, sol, gt) == ("guess", "guess 9 \nlower \n", "9")
    assert extra["trajectory_id"] == "s2-g1-i1" and extra["env_kwargs"] == {"high": 16}
    assert extra["actions"] == ["guess 9 \n"] and extra["prompt"] == "find 1 16\n" and extra["num_turns"] == 1


def test_a_verl_function_that_raises_on_one_trajectory_fails_that_one_alone():
    def picky(data_source, solution_str, ground_truth, extra_info):
        if "5" in solution_str:
            raise KeyError("five")
        return 1.0

    out = _rows(apply_reward(_batch(), picky))
    assert out["s2-g1-i0"]["reward"] == 1.0 and out["s2-g1-i1"]["reward"] == 1.0
    bad = out["s2-g1-i2"]
    assert bad["finish_reason"] == "failed" and math.isnan(bad["reward"])
    assert "'picky' raised KeyError: 'five' for trajectory s2-g1-i2" in bad["error"]


def test_a_verl_dict_without_a_score_fails_the_trajectory_naming_its_keys():
    out = _rows(apply_reward(_batch(), lambda data_source, solution_str, ground_truth, extra_info: {"acc": 1.0}))
    assert "returned a dict without 'score' (keys ['acc'])" in out["s2-g1-i0"]["error"]


def test_a_trl_function_gets_the_batch_as_keyword_lists():
    seen = {}

    def trl_reward(completions, ground_truth, **kwargs):
        seen.update(kwargs, completions=completions, ground_truth=ground_truth)
        return [float(c.split()[1] == g) for c, g in zip(completions, ground_truth)]

    assert shape_of(trl_reward) == "trl"
    out = apply_reward(_batch(failed=(0,)), trl_reward)
    assert out.column("reward").to_pylist()[1:] == [1.0, 0.0]
    assert seen["completions"] == ["guess 9 \nlower \n", "guess 5 \nlower \n"]  # the failed row is not scored
    assert seen["prompts"] == ["find 1 16\n"] * 2 and seen["completion_ids"] == [[3, 4], [3, 4]]
    assert seen["trajectory_id"] == ["s2-g1-i1", "s2-g1-i2"] and seen["env_reward"] == [0.5, 1.0]


def test_a_trl_function_without_kwargs_gets_only_what_it_names_and_a_miscount_fails_its_rows():
    out = apply_reward(_batch(), lambda prompts, completions: [len(c) for c in completions])
    assert out.column("reward").to_pylist() == [16.0, 16.0, 16.0]
    out = _rows(apply_reward(_batch(), lambda completions, **kw: [1.0]))
    assert "returned 1 values for 3 trajectories" in out["s2-g1-i0"]["error"]
    # TRL's None ("does not apply") is not a reward here
    out = _rows(apply_reward(_batch(), lambda completions, **kw: [1.0, None, 0.0]))
    assert out["s2-g1-i1"]["finish_reason"] == "failed" and "returned None" in out["s2-g1-i1"]["error"]


@pytest.mark.parametrize("fn", [lambda: [1.0], lambda a, b: [1.0], lambda solution_str, answer: 1.0,
                                lambda completions, answer_key: [1.0]])
def test_a_function_of_no_known_shape_is_refused_at_the_graph_naming_the_node_and_its_parameters(fn):
    with pytest.raises(ValueError, match="expected one of"):
        shape_of(fn)
    with pytest.raises(GraphError, match=r"has parameters.*\[node='reward'\]"):
        validate_step(rl_step("g", "guess", 2, 2, reward=fn))


def test_rewards_weigh_their_terms_and_keep_each_one():
    def fmt(batch):
        return [1.0 if a[0].startswith("guess") else 0.0 for a in batch.column("actions").to_pylist()]

    rewards = rose.Rewards.of({"correct": compute_score, "format": (fmt, 0.2)})
    assert [(t.name, t.weight, t.shape) for t in rewards.terms] == [("correct", 1.0, "verl"), ("format", 0.2, "batch")]
    out = _rows(apply_reward(_batch(), rewards))
    assert out["s2-g1-i1"]["reward"] == pytest.approx(1.2) and out["s2-g1-i0"]["reward"] == pytest.approx(0.2)
    assert dict(out["s2-g1-i1"]["reward_terms"]) == {"correct": 1.0, "format": 1.0}
    # the same through the graph's dict form, and the per-term means the step metrics show
    table = pa.Table.from_batches([apply_reward(_batch(), {"correct": compute_score, "format": (fmt, 0.2)})])
    assert term_means(table) == {"reward/correct": pytest.approx(1 / 3), "reward/format": 1.0}
    assert term_means(pa.Table.from_batches([apply_reward(_batch(), fmt)])) == {}  # one function: no terms


def test_a_term_that_cannot_score_a_row_fails_it_and_overflow_is_not_a_reward():
    def half(batch):
        return [1.0, float("nan"), 1.0]

    out = _rows(apply_reward(_batch(), {"a": compute_score, "b": half}))
    assert out["s2-g1-i1"]["finish_reason"] == "failed" and "'half' returned nan" in out["s2-g1-i1"]["error"]
    assert out["s2-g1-i1"]["reward_terms"] == [] and out["s2-g1-i0"]["reward"] == 1.0
    out = _rows(apply_reward(_batch(), {"a": (lambda b: [3e38] * 3, 1.0), "b": (lambda b: [3e38] * 3, 1.0)}))
    assert out["s2-g1-i0"]["finish_reason"] == "failed" and "is not finite" in out["s2-g1-i0"]["error"]


def test_bad_terms_are_config_errors():
    with pytest.raises(ConfigError, match="Reward.weight=nan"):
        Reward(compute_score, float("nan"))
    with pytest.raises(ConfigError, match="distinct names"):
        Rewards((Reward(compute_score), Reward(compute_score)))
    with pytest.raises(ConfigError, match="Reward.shape='grpo'"):
        Reward(compute_score, shape="grpo")


def test_response_is_each_action_then_the_reply_to_it():
    assert response(["a ", "b "], ["x\n"]) == "a x\nb "


def test_an_older_run_directorys_trajectories_are_read_into_this_schema():
    old = pa.Table.from_batches([_batch()]).drop_columns(["prompt", "actions", "observations", "ground_truth",
                                                         "reward_terms"])
    new = upgrade(old)
    assert new.schema.equals(TRAJECTORY_SCHEMA) and new["prompt"].to_pylist() == [""] * 3
    assert new["ground_truth"].to_pylist() == [None] * 3 and new["token_ids"].equals(old["token_ids"])
    with pytest.raises(ValueError, match="columns \\['mystery'\\]"):
        upgrade(old.append_column("mystery", pa.array(np.zeros(3))))
