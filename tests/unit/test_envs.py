import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.errors import ConfigError
from rose.envs import env_class, make_env, replay
from rose.envs.guess import MALFORMED_REWARD


@given(seed=st.integers(0, 2**31), actions=st.lists(st.sampled_from(
    ["guess 1", "guess 8", "guess 16", "guess 3", "calc 3 * 4", "answer 12", "bogus", ""]), max_size=6))
@settings(max_examples=100, deadline=None)
@pytest.mark.parametrize("name", ["guess", "calc"])
def test_envs_are_deterministic_given_seed_and_actions(name, seed, actions):
    a, b = make_env(name), make_env(name)
    first_a, steps_a = replay(a, seed, actions)
    first_b, steps_b = replay(b, seed, actions)
    assert first_a == first_b
    assert steps_a == steps_b


def test_guess_feedback_and_rewards():
    env = make_env("guess")
    env.reset(0)
    target = env.target
    r = env.step(f"guess {target}")
    assert r.done and r.reward == pytest.approx(1.0) and r.observation == "correct\n"
    env.reset(0)
    low = env.step("guess 1") if target != 1 else env.step("guess 2")
    assert low.observation in ("higher\n", "lower\n") and not low.done and low.reward == 0.0
    env.reset(0)
    assert env.step("guess banana").reward == MALFORMED_REWARD
    env.reset(0)
    assert env.step("guess 99").done  # out of range is malformed


def test_guess_reward_decreases_with_turns():
    env = make_env("guess")
    env.reset(5)
    t = env.target
    wrong = 1 if t != 1 else 2
    env.step(f"guess {wrong}")
    assert env.step(f"guess {t}").reward == pytest.approx(0.9)


def test_calc_tool_call_enters_context():
    env = make_env("calc")
    first = env.reset(3)
    a, b = int(first.split()[2]), int(first.split()[4])
    tool = env.step(f"calc {a} * {b}")
    assert tool.observation == f"= {a * b}\n" and not tool.done
    ans = env.step(f"answer {a * b}")
    assert ans.done and ans.reward == 1.0
    env.reset(3)
    assert env.step("answer 0").reward == 0.0
    env.reset(3)
    assert env.step("calc x * 2").reward == -1.0


@pytest.mark.parametrize("name", ["guess", "calc"])
def test_demonstrations_are_winning_or_valid_play(name):
    cls = env_class(name)
    rng = random.Random(0)
    for _ in range(50):
        segs = cls.demonstration(rng)
        seed_text = segs[0][0]
        assert not segs[0][1] and seed_text.endswith("\n")
        for text, is_policy in segs[1:]:
            if is_policy:
                words = text.split()
                assert words[0] in ("guess", "calc", "answer")


def test_unknown_env_names_the_choices():
    with pytest.raises(ConfigError, match="unknown environment 'nope'.*guess"):
        make_env("nope")
    with pytest.raises(ConfigError, match="cannot import environment"):
        make_env("no_such_module:Env")


def test_env_by_import_path():
    env = make_env("tests.helpers.envs:ScriptedEnv", turns=1)
    assert env.reset(4) == "start 4\n"
