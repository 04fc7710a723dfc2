"""Provenance of trajectories: does each recorded conversation come from its environment?

Environments are deterministic in (seed, actions) (`rose.envs.base`), so a trajectory row can be
checked without the policy: reset the environment with the row's seed, feed it the policy's recorded
actions (the decoded token spans where `loss_mask` is true, as the agent loop decodes them), and every
observation it answers must be, token for token, what the row recorded after that turn (where
`loss_mask` is false). The replay must also end where the row ends (`finish_reason`, number of
turns) and pay what the row says the environment paid (`env_reward`).

That catches a flipped or lost environment token, and a turn dropped or repeated whenever it changes
what the environment says, pays or how the episode ends. A repeated turn the environment cannot tell
apart (a guess asked again gets the same answer) is caught by its copy: the same tokens with the same
behaviour log-probs in a different context, which a policy turn does not produce. A dropped turn that
leaves a conversation the environment accepts as it is (a calc episode without its tool call) is not
caught here; the row carries nothing else to compare with.

`check_provenance` is a pure function of the table (each row records the kwargs its environment was
built with, `env_kwargs`) and the policy's tokenizer; it only runs environments, never a model.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from rose.models.turns import turn_format

# Columns a replay reads. `env_kwargs` (a JSON object per row) is read when present, see
# `check_provenance`.
_COLUMNS = ("trajectory_id", "env", "env_seed", "token_ids", "logprobs", "loss_mask", "weight_versions",
            "turn_offsets", "num_turns", "turn_workers", "env_reward", "finish_reason")
# A behaviour log-prob this far below 0 is a real choice: two turns in different contexts do not both
# get exactly the same float32 values for it unless one is a copy of the other. Near-certain tokens
# (log-prob ~0) can repeat genuinely, so a turn made only of them is never called a copy.
_CHOICE_LOGPROB = -1e-3
_REWARD_ATOL = 1e-5  # env_reward is float32


class _Mismatch(Exception):
    """One reason a row does not check out (internal: becomes a (trajectory_id, reason) pair)."""


def check_provenance(table: pa.Table | pa.RecordBatch, tokenizer,
                     env_kwargs: Mapping[str, Mapping] | None = None) -> list[tuple[str, str]]:
    """(trajectory_id, reason) for each non-failed trajectory whose replay does not reproduce it.

    `tokenizer`: the policy's (a Hugging Face tokenizer, e.g. `AutoTokenizer.from_pretrained(model_dir)`),
    the one the rollouts encoded observations and decoded actions with.
    `env_kwargs`: environment name -> kwargs, for rows that do not record theirs (a table written
    before schema v3, or a null `env_kwargs`); a row's own `env_kwargs` (JSON) wins. Rows with `finish_reason == "failed"` are skipped: they claim no conversation.
    An empty list means every trajectory checked out. One reason per trajectory: the first found.
    """
    missing = [c for c in _COLUMNS if c not in table.schema.names]
    if missing:
        raise ValueError(f"cannot check provenance: the table lacks column(s) {missing}")
    cols = {c: table.column(c).to_pylist() for c in _COLUMNS}
    row_kwargs = table.column("env_kwargs").to_pylist() if "env_kwargs" in table.schema.names else None
    bad = []
    for i, tid in enumerate(cols["trajectory_id"]):
        if cols["finish_reason"][i] == "failed":
            continue
        row = {c: cols[c][i] for c in _COLUMNS}
        try:
            kwargs = _kwargs_of(row["env"], env_kwargs, None if row_kwargs is None else row_kwargs[i])
            turns = _split(row)
            _no_copied_turn(row, turns)
            _replay(row, turns, tokenizer, kwargs)
        except _Mismatch as e:
            bad.append((tid, str(e)))
    return bad


def _kwargs_of(env: str, env_kwargs, recorded) -> dict:
    if recorded is not None:
        import json

        try:
            return dict(json.loads(recorded))
        except (TypeError, ValueError) as e:
            raise _Mismatch(f"cannot replay: env_kwargs {recorded!r} is not a JSON object ({e})") from None
    return dict((env_kwargs or {}).get(env, {}))


def _split(row: dict) -> list[tuple[int, int, int]]:
    """Per policy turn: (start, end of its generated span, end of the observation after it).

    Checks the row's own shape first: aligned token columns, one offset and one worker per turn, a
    generated span starting at each offset and no policy token anywhere else."""
    tokens, mask, versions = row["token_ids"], row["loss_mask"], row["weight_versions"]
    offsets, n = row["turn_offsets"], len(row["turn_offsets"])
    lengths = {len(tokens), len(mask), len(row["logprobs"]), len(versions)}
    if len(lengths) != 1:
        raise _Mismatch(f"token columns have different lengths (token_ids {len(tokens)}, loss_mask {len(mask)}, "
                        f"logprobs {len(row['logprobs'])}, weight_versions {len(versions)})")
    if row["num_turns"] != n or len(row["turn_workers"]) != n:
        raise _Mismatch(f"turn count disagrees: num_turns={row['num_turns']}, {n} turn_offsets, "
                        f"{len(row['turn_workers'])} turn_workers")
    if any(b <= a for a, b in zip(offsets, offsets[1:])) or (n and not 0 <= offsets[0] <= offsets[-1] < len(tokens)):
        raise _Mismatch(f"turn_offsets {offsets} are not increasing offsets into {len(tokens)} tokens")
    turns = []
    for t, start in enumerate(offsets):
        stop = offsets[t + 1] if t + 1 < n else len(tokens)
        gen_end = start
        while gen_end < stop and mask[gen_end]:
            gen_end += 1
        if gen_end == start:
            raise _Mismatch(f"turn {t} starts at token {start}, which is not a policy token (loss_mask false)")
        turns.append((start, gen_end, stop))
    policy = np.zeros(len(tokens), dtype=bool)
    for start, gen_end, _ in turns:
        policy[start:gen_end] = True
    stray = np.flatnonzero(policy != np.asarray(mask, dtype=bool))
    if stray.size:
        raise _Mismatch(f"token {stray[0]} has loss_mask true but belongs to no policy turn's span")
    # Versions travel with the mask: a shifted column shows here before the replay has to find it.
    wrong = np.flatnonzero((np.asarray(versions) >= 0) != policy)
    if wrong.size:
        k = int(wrong[0])
        raise _Mismatch(f"token {k} has weight_version {versions[k]} but loss_mask {mask[k]} (policy tokens carry "
                        f"a version >= 0, prompt and environment tokens -1)")
    return turns


def _no_copied_turn(row: dict, turns: list[tuple[int, int, int]]) -> None:
    tokens, logprobs = row["token_ids"], row["logprobs"]
    seen: dict[tuple, int] = {}
    for t, (start, gen_end, stop) in enumerate(turns):
        lp = tuple(logprobs[start:gen_end])
        if not any(x < _CHOICE_LOGPROB for x in lp):
            continue  # near-certain tokens only: a genuine repeat looks the same
        key = (tuple(tokens[start:stop]), lp)
        if key in seen:
            raise _Mismatch(f"turn {t} repeats turn {seen[key]} exactly: the same tokens with the same behaviour "
                            f"log-probs in a different context (a turn recorded twice)")
        seen[key] = t


def _first_difference(recorded: list[int], replayed: list[int], at: int, tokenizer) -> str:
    k = next((j for j, (a, b) in enumerate(zip(recorded, replayed)) if a != b), min(len(recorded), len(replayed)))

    def show(ids):
        return repr(tokenizer.decode(ids[k:k + 3])) if k < len(ids) else "nothing"

    return f"at token {at + k}: recorded {show(recorded)}, the environment says {show(replayed)}"


def _replay(row: dict, turns: list[tuple[int, int, int]], tokenizer, kwargs: dict) -> None:
    from rose.envs import make_env

    tokens, env_name = row["token_ids"], row["env"]
    if row["env_seed"] is None:
        raise _Mismatch("cannot replay: the row has no env_seed")
    try:
        env = make_env(env_name, **kwargs)
        first = env.reset(row["env_seed"])
    except Exception as e:
        raise _Mismatch(f"cannot replay: environment {env_name!r} with kwargs {kwargs} failed to start: "
                        f"{type(e).__name__}: {e}") from None
    fmt = turn_format(tokenizer)  # the agent loop's (rose.models.turns): plain text or the chat template
    prompt, recorded = fmt.prompt(first), tokens[:turns[0][0]] if turns else tokens
    if prompt != recorded:
        raise _Mismatch(f"the prompt is not the environment's first observation "
                        f"{_first_difference(recorded, prompt, 0, tokenizer)}")
    paid, done_at = 0.0, None
    for t, (start, gen_end, stop) in enumerate(turns):
        if done_at is not None:
            raise _Mismatch(f"turn {t} comes after the environment ended the episode at turn {done_at} "
                            f"(a turn recorded twice, or one that never happened)")
        if t >= env.max_turns:
            raise _Mismatch(f"{len(turns)} turns recorded; the environment allows {env.max_turns}")
        action = tokenizer.decode(tokens[start:gen_end], skip_special_tokens=True)
        try:
            result = env.step(action)
        except Exception as e:
            raise _Mismatch(f"replay of turn {t} (action {action!r}) raised {type(e).__name__}: {e}") from None
        paid += float(result.reward)
        expected = fmt.after(tokens[start:gen_end], result.observation, bool(result.done))
        if tokens[gen_end:stop] != expected:
            raise _Mismatch(f"the observation after turn {t} is not what the environment answers to {action!r} "
                            f"{_first_difference(tokens[gen_end:stop], expected, gen_end, tokenizer)}")
        if result.done:
            done_at = t
    _check_ending(row, len(turns), done_at, env.max_turns)
    if abs(float(np.float32(paid)) - row["env_reward"]) > _REWARD_ATOL:
        raise _Mismatch(f"env_reward {row['env_reward']:g} recorded, the replay pays {paid:g} "
                        f"(a turn dropped or repeated changes what the environment pays)")


def _check_ending(row: dict, n: int, done_at: int | None, max_turns: int) -> None:
    reason = row["finish_reason"]
    if done_at is not None:
        if reason != "done":
            raise _Mismatch(f"the environment ended the episode at turn {done_at}, but the row says "
                            f"finish_reason {reason!r} after {n} turns")
    elif reason == "done":
        raise _Mismatch(f"finish_reason 'done' after {n} turns, but the environment has not ended the episode "
                        f"(a turn dropped at the end?)")
    elif reason == "max_turns" and n != max_turns:
        raise _Mismatch(f"finish_reason 'max_turns' after {n} turns; the environment allows {max_turns}")
    elif reason == "length" and n >= max_turns:
        raise _Mismatch(f"finish_reason 'length' after {n} turns, all the environment allows ({max_turns})")
    elif reason not in ("max_turns", "length"):
        raise _Mismatch(f"unknown finish_reason {reason!r}")
