"""Provenance: a replay of each trajectory's environment with its recorded actions reproduces it.

The tables are made by the real agent loop (rose/ops/rollout.py) with the tiny models' tokenizer; only
the policy is scripted (each turn's action chosen here, with made-up behaviour log-probs), so the rows
have exactly the shape rollouts give them.
"""
import asyncio
import random
import zlib
from concurrent.futures import Future

import pyarrow as pa
import pytest

from rose.envs import env_class
from rose.models.tiny import build_tokenizer
from rose.ops.rollout import RolloutSpec, agent_loop
from rose.envs.provenance import check_provenance
from rose.runtime.engine.base import Generation
from rose.runtime.trajectory import TRAJECTORY_SCHEMA, Trajectory, to_batch


class ScriptedPolicy:
    """A rollout engine whose turns are given: request "{trajectory_id}-t{turn}" -> action text."""

    def __init__(self, tokenizer, actions: dict[str, list[str]], certain: bool = False):
        self.tok, self.actions, self.certain = tokenizer, actions, certain

    def generate(self, prompt, sampling, request_id):
        tid, _, turn = request_id.rpartition("-t")
        ids = self.tok(self.actions[tid][int(turn)] + "\n", add_special_tokens=False)["input_ids"]
        rng = random.Random(zlib.crc32(request_id.encode()))
        lp = [0.0 if self.certain else -rng.uniform(0.01, 3.0) for _ in ids]
        fut = Future()
        fut.set_result(Generation(ids, lp, [0] * len(ids), "stop"))
        return fut


def rollout(env: str, episodes: list[tuple[int, list[str]]], env_kwargs=None, certain=False):
    """(table, tokenizer): one trajectory per (env seed, actions), through the agent loop."""
    tok = build_tokenizer(env_class(env).vocabulary())
    specs = [RolloutSpec(step=0, group_id=g, sample_id=0, env=env, env_seed=seed, env_kwargs=env_kwargs or {})
             for g, (seed, _) in enumerate(episodes)]
    policy = ScriptedPolicy(tok, {s.trajectory_id: acts for s, (_, acts) in zip(specs, episodes)}, certain)

    async def run():
        return [await agent_loop(s, env_class(env)(**(env_kwargs or {})), policy, tok, 256, "tcp://w:1")
                for s in specs]

    trajs = asyncio.run(run())
    assert all(t.finish_reason != "failed" for t in trajs), [t.error for t in trajs]
    return pa.Table.from_batches([to_batch(trajs)]), tok


def target(seed, low=1, high=16):
    return random.Random(seed).randint(low, high)


def miss(seed, k=0):
    """A guess that is not the target of `seed` (the k-th such)."""
    return f"guess {[n for n in range(1, 17) if n != target(seed)][k]}"


def guess_episodes():
    """A number found on the second turn (0.9), a malformed action (-1), five misses (0; `guess` itself
    ends the episode on its last turn)."""
    return [(0, [miss(0), f"guess {target(0)}"]),
            (1, [miss(1, 4), "hello"]),
            (2, [miss(2, k) for k in range(5)])]


@pytest.fixture(scope="module")
def guess():
    return rollout("guess", guess_episodes())


def edit(table, tid, fn):
    """The table with row `tid` changed by fn(row) (a dict of the row's columns)."""
    rows = table.to_pylist()
    for r in rows:
        if r["trajectory_id"] == tid:
            fn(r)
    return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)


SCRIPTED = "tests.helpers.envs:ScriptedEnv"
TOKEN_COLUMNS = ("token_ids", "logprobs", "loss_mask", "weight_versions")


def turn_span(r, t):
    offs = r["turn_offsets"]
    return offs[t], offs[t + 1] if t + 1 < len(offs) else len(r["token_ids"])


def duplicate_turn(r, t):
    """Record turn t (its tokens and the observation after it) twice in a row, as a resumed rollout
    that appended its last turn again would."""
    a, b = turn_span(r, t)
    for c in TOKEN_COLUMNS:
        r[c] = r[c][:b] + r[c][a:b] + r[c][b:]
    r["turn_offsets"] = r["turn_offsets"][:t + 1] + [o + (b - a) for o in r["turn_offsets"][t:]]
    r["turn_workers"] = r["turn_workers"][:t + 1] + r["turn_workers"][t:]
    r["num_turns"] += 1


def drop_turn(r, t):
    a, b = turn_span(r, t)
    for c in TOKEN_COLUMNS:
        r[c] = r[c][:a] + r[c][b:]
    r["turn_offsets"] = r["turn_offsets"][:t] + [o - (b - a) for o in r["turn_offsets"][t + 1:]]
    r["turn_workers"] = r["turn_workers"][:t] + r["turn_workers"][t + 1:]
    r["num_turns"] -= 1


def test_rollout_shaped_tables_check_out(guess):
    table, tok = guess
    assert table["finish_reason"].to_pylist() == ["done", "done", "done"]
    assert table["num_turns"].to_pylist() == [2, 2, 5]
    assert check_provenance(table, tok) == []
    calc, ctok = rollout("calc", [(3, ["calc 7 * 5", "answer 35"]), (4, ["answer 3"]), (5, ["calc x", "ignored"])])
    assert check_provenance(calc, ctok) == []


def test_a_flipped_observation_token_is_named(guess):
    table, tok = guess
    r = table.to_pylist()[2]  # "higher"/"lower" after each miss
    first_obs = r["loss_mask"].index(False, r["turn_offsets"][1])
    higher, lower = tok.convert_tokens_to_ids(["higher", "lower"])

    def flip(row):
        row["token_ids"][first_obs] = lower if row["token_ids"][first_obs] == higher else higher

    bad = check_provenance(edit(table, "s0-g2-i0", flip), tok)
    assert [tid for tid, _ in bad] == ["s0-g2-i0"]
    assert "observation after turn 1" in bad[0][1] and f"token {first_obs}" in bad[0][1]


@pytest.mark.parametrize("tid,turn", [("s0-g0-i0", 0), ("s0-g2-i0", 3), ("s0-g1-i0", 0)])
def test_a_duplicated_turn_is_named(guess, tid, turn):
    table, tok = guess
    bad = check_provenance(edit(table, tid, lambda r: duplicate_turn(r, turn)), tok)
    assert [t for t, _ in bad] == [tid], bad
    assert "repeats turn" in bad[0][1] or "environment allows" in bad[0][1]


def test_a_duplicated_turn_of_certain_tokens_is_caught_by_the_replay():
    # log-probs 0 everywhere: a repeat is not recognisable as a copy; the environment's turn count is
    table, tok = rollout("guess", [(0, [miss(0), f"guess {target(0)}"])], certain=True)
    bad = check_provenance(edit(table, "s0-g0-i0", lambda r: duplicate_turn(r, 0)), tok)
    assert [t for t, _ in bad] == ["s0-g0-i0"] and "env_reward" in bad[0][1], bad
    bad = check_provenance(edit(table, "s0-g0-i0", lambda r: duplicate_turn(r, 1)), tok)
    assert [t for t, _ in bad] == ["s0-g0-i0"] and "after the environment ended" in bad[0][1], bad


@pytest.mark.parametrize("tid,turn,says", [("s0-g0-i0", 0, "env_reward"), ("s0-g2-i0", 2, "has not ended"),
                                           ("s0-g0-i0", -1, "has not ended the episode")])
def test_a_dropped_turn_is_named(guess, tid, turn, says):
    table, tok = guess
    n = table.filter(pa.compute.equal(table["trajectory_id"], tid))["num_turns"][0].as_py()
    bad = check_provenance(edit(table, tid, lambda r: drop_turn(r, turn % n)), tok)
    assert [t for t, _ in bad] == [tid] and says in bad[0][1], bad


def test_an_episode_cut_at_max_turns_checks_out_and_a_dropped_turn_does_not():
    # an environment that never ends the episode itself: the agent loop stops it at max_turns
    table, tok = rollout(SCRIPTED, [(7, ["ok", "no", "ok"])], env_kwargs={"turns": 9})
    assert table["finish_reason"].to_pylist() == ["max_turns"]
    assert check_provenance(table, tok, env_kwargs={SCRIPTED: {"turns": 9}}) == []
    bad = check_provenance(edit(table, "s0-g0-i0", lambda r: drop_turn(r, 2)), tok, env_kwargs={SCRIPTED: {"turns": 9}})
    assert [t for t, _ in bad] == ["s0-g0-i0"] and "'max_turns' after 2 turns" in bad[0][1], bad


def test_a_turn_count_that_disagrees_with_the_tokens_is_named(guess):
    table, tok = guess
    bad = check_provenance(edit(table, "s0-g1-i0", lambda r: r.update(turn_workers=r["turn_workers"] * 2)), tok)
    assert [t for t, _ in bad] == ["s0-g1-i0"] and "turn count disagrees" in bad[0][1]


def test_failed_rows_are_skipped(guess):
    table, tok = guess
    failed = to_batch([Trajectory(0, 9, 0, "guess", 0, finish_reason="failed", error="EnvError: boom")])
    both = pa.concat_tables([table, pa.Table.from_batches([failed])])
    assert check_provenance(both, tok) == []


def test_replay_builds_the_environment_with_the_kwargs_the_row_records():
    found = target(5, high=4)
    table, tok = rollout("guess", [(5, [f"guess {n}" for n in range(1, found + 1)])], env_kwargs={"high": 4})
    assert table["env_kwargs"].to_pylist() == ['{"high": 4}']
    assert check_provenance(table, tok) == []
    i = table.schema.get_field_index("env_kwargs")
    forgotten = table.set_column(i, "env_kwargs", pa.array([None], pa.string()))
    assert check_provenance(forgotten, tok, env_kwargs={"guess": {"high": 4}}) == []  # the caller's, then
    bad = check_provenance(forgotten, tok)  # defaults: 1..16, another prompt
    assert [t for t, _ in bad] == ["s0-g0-i0"] and "prompt" in bad[0][1]
