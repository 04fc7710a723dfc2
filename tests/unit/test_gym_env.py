"""The gymnasium adapter (rose/envs/gym.py) and FrozenLake through it (rose/envs/frozenlake.py)."""
import random

import pytest

from rose.envs import env_class, make_env
from rose.envs.base import Env
from rose.envs.provenance import check_provenance
from rose.envs.frozenlake import FrozenLakeEnv
from rose.envs.gym import GymTextEnv
from rose.models.tiny import build_tokenizer
from tests.unit.test_provenance import rollout


def test_frozenlake_is_a_registered_env_with_a_new_map_per_seed():
    env = make_env("frozenlake")
    assert isinstance(env, Env) and env_class("frozenlake") is FrozenLakeEnv
    first = env.reset(11)
    assert first == make_env("frozenlake").reset(11)  # deterministic in the seed
    assert len({make_env("frozenlake").reset(s) for s in range(20)}) > 10
    rows = first.splitlines()
    assert len(rows) == 4 and rows[0].split()[0] == "P" and rows[-1].split()[-1] == "G"
    assert int(env.ground_truth) >= 6  # corner to corner on a 4x4 map


def _play(env, words):
    return [env.step(w) for w in words]


def test_moves_holes_goal_and_malformed_actions():
    env = FrozenLakeEnv()
    env.reset(3)
    path = env._path_from(0)
    results = _play(env, path)
    assert [r.done for r in results] == [False] * (len(path) - 1) + [True]
    assert results[-1].reward == 1.0 and sum(r.reward for r in results) == 1.0
    env.reset(3)
    step = env.step(path[0])
    assert step.observation.replace(" ", "").replace("\n", "").index("P") in (1, 4)  # right or down of the start
    env.reset(3)
    bad = env.step("left right")
    assert (bad.reward, bad.done, bad.observation) == (FrozenLakeEnv.malformed_reward, True, "")
    # Into a hole: zero reward, episode over.
    for seed in range(50):
        env.reset(seed)
        if env.desc[0][1] == "H":
            r = env.step("right")
            assert (r.reward, r.done) == (0.0, True)
            break
    else:
        pytest.fail("no map among 50 seeds had a hole right of the start")


def test_turn_limit_ends_the_episode():
    env = FrozenLakeEnv(max_turns=3)
    env.reset(5)
    results = _play(env, ["up", "left", "up"])  # into the walls: stays at the start
    assert [r.done for r in results] == [False, False, True] and results[-1].observation == ""


def test_demonstrations_speak_the_vocabulary_one_action_word_a_turn():
    tok = build_tokenizer(FrozenLakeEnv.vocabulary())
    rng = random.Random(0)
    for _ in range(100):
        segments = FrozenLakeEnv.demonstration(rng)
        text = "".join(t for t, _ in segments)
        assert tok.unk_token_id not in tok(text, add_special_tokens=False)["input_ids"]
        assert all(t[:-1] in FrozenLakeEnv.action_words and t.endswith("\n") for t, policy in segments if policy)


def test_rollouts_replay_for_provenance():
    table, tok = rollout("frozenlake", [(3, _shortest(3)), (4, ["up", "left"] * 4)])
    assert check_provenance(table, tok) == []
    rows = table.to_pylist()
    assert rows[0]["finish_reason"] == "done" and rows[0]["env_reward"] == 1.0
    assert rows[1]["num_turns"] == 8 and rows[1]["finish_reason"] == "done" and rows[1]["env_reward"] == 0.0


def _shortest(seed):
    env = FrozenLakeEnv()
    env.reset(seed)
    return env._path_from(0)


def test_an_adapter_whose_words_do_not_match_the_action_space_says_so():
    class Wrong(GymTextEnv):
        name = "wrong"
        gym_id = "FrozenLake-v1"
        action_words = ("left", "right")

        def describe(self, observation, info):
            return f"{observation}\n"

    with pytest.raises(ValueError, match="action_words names 2 actions"):
        Wrong().reset(0)
