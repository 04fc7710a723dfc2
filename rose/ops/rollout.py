"""The rollout op: one multi-turn conversation between the policy (a vLLM engine) and an environment.

Each GRPO group is one Dask task (one trajectory per task multiplies Dask's per-task cost, a few
milliseconds, by the group size for no gain: a group is retried, placed and trained on as a whole).
The task runs the agent loop below for each of its trajectories; every policy turn is a request
handed to the worker's engine loop, where it is batched with the turns of every other rollout on that
worker. The task is a coroutine, so a hundred rollouts wait on one thread instead of a hundred threads;
it runs its group on the event loop of the thread that steps the worker's engine (a dedicated worker's
engine loop, a serving worker's co-serving executor), so that a turn never crosses threads
(rose/ops/engine_calls.py; measured in benchmarks/rollout_overhead.py and benchmarks/coserve_slo.py).
The result is an Arrow RecordBatch of the trajectory schema. Nothing is lost on failure:
an environment that raises, hangs past `env_timeout_s` or returns nonsense, or a prompt that does not
fit, yields a row with finish_reason "failed" and the error text (naming the environment, the turn and
the trajectory id), and the rest of the group and the step go on.

Shedding: when the placement plugin asks this worker to give a task back (its serving traffic needs
the capacity), every trajectory of the task stops at its next turn boundary and the task gives its slots
back at once (`RoseWorker.yield_slots`); it then resubmits its `Continuation`, which resumes elsewhere from
where it stopped, and returns the group's trajectories when they are all done (`run_rollout`).
"""
from __future__ import annotations

import asyncio
import json
import reprlib
import time
import traceback
import zlib
from dataclasses import dataclass, field

import pyarrow as pa

from rose.errors import EngineError, EnvError, PromptTooLongError
from rose.envs.base import StepResult, inline_by_name, is_inline, replay
from rose.envs.deadline import DeadlineExceeded, call_with_deadline
from rose.models.tokens import decode
from rose.models.turns import turn_format
from rose.ops.engine_calls import failed_group, generate_turn, on_engine_loop, stamp
from rose.ops.reward import as_reward
from rose.runtime.engine.base import SamplingSpec
from rose.runtime.protocol import Annotation, resume_key
from rose.runtime.trajectory import Trajectory, to_batch, trajectory_id


@dataclass(frozen=True)
class RolloutSpec:
    """Everything needed to (re)run one trajectory; the same spec always gives the same ids."""

    step: int
    group_id: int
    sample_id: int
    env: str  # environment name
    env_seed: int  # seed for Env.reset; shared by a GRPO group
    env_kwargs: dict = field(default_factory=dict)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0  # run seed; per-turn sampling seeds derive from it and the trajectory id
    request_timeout_s: float = 600.0  # a policy turn not answered in this long fails the trajectory
    env_timeout_s: float = 60.0  # an environment call (reset, step) that takes longer fails the trajectory

    @property
    def trajectory_id(self) -> str:
        return trajectory_id(self.step, self.group_id, self.sample_id)

    def trajectory(self, **fields) -> Trajectory:
        """A new row for this spec; it records the environment's kwargs, which a replay needs."""
        return Trajectory(self.step, self.group_id, self.sample_id, self.env, self.env_seed,
                          json.dumps(self.env_kwargs), **fields)

    def turn_seed(self, turn: int) -> int:
        return zlib.crc32(f"{self.seed}/{self.trajectory_id}/{turn}".encode())


@dataclass
class Partial:
    """Where a shed trajectory stopped: enough to resume it on another worker."""

    traj: Trajectory  # so far; its `actions` rebuild the environment (replayed from the seed)
    turn: int  # the next policy turn


@dataclass
class Continuation:
    """What a shed group's run gives at once: its finished trajectories and where the others stopped.
    The group's first task resubmits it (`resume_rollout`) and the placement puts it elsewhere; its
    trajectory ids stay those of `specs`, so nothing is lost or duplicated."""

    key: str  # the original rollout task's key
    attempt: int  # times this group has been shed so far (1 for the first continuation)
    specs: tuple[RolloutSpec, ...]
    states: list  # per spec: a finished Trajectory or a Partial
    worker: str | None  # the worker it should resume on (its engine holds these prefixes); None: any

    @property
    def width(self) -> int:
        """Trajectories still to run."""
        return sum(isinstance(s, Partial) for s in self.states)


# Environment answers quoted in errors: long enough to see what was wrong, bounded for huge ones.
_quote = reprlib.Repr()
_quote.maxstring, _quote.maxother, _quote.maxlist, _quote.maxtuple = 120, 200, 8, 8
_quote = _quote.repr

async def env_call(spec: RolloutSpec, what: str, turn: int | None, fn, *args, timeout_s: float | None = None,
                   inline: bool = False):
    """One call into the environment (`what`: reset, step, replay, construction) under its deadline.

    Any failure becomes an `EnvError` naming the environment, the call, the turn and the trajectory.
    The call runs in a thread of its own (`call_with_deadline`): a sync call that hangs cannot be
    cancelled, so past the deadline the trajectory fails and the thread is abandoned. `inline`: the
    environment declared its calls instant and non-blocking (`Env.inline`); run it right here."""
    timeout_s = spec.env_timeout_s if timeout_s is None else timeout_s
    try:
        if inline:
            return fn(*args)
        return await call_with_deadline(fn, *args, timeout_s=timeout_s, name=f"env {spec.trajectory_id} {what}")
    except DeadlineExceeded:
        where, ctx = _where(spec, what, turn)
        raise EnvError(f"{where} did not return within env_timeout_s={timeout_s:g} s (its thread is abandoned: "
                       f"a sync call cannot be cancelled)", **ctx) from None
    except Exception as e:
        where, ctx = _where(spec, what, turn)
        raise EnvError(f"{where} raised {type(e).__name__}: {e}", **ctx) from e


def _where(spec: RolloutSpec, what: str, turn: int | None) -> tuple[str, dict]:
    """An environment call's failure: the words that name the call, and the error's context. Made only on
    failure: twice a turn, on the engine's thread, they cost about 0.6 us each."""
    where = f"environment {spec.env!r} {what}" + ("" if turn is None else f" at turn {turn}")
    return where, {"trajectory_id": spec.trajectory_id, "env": spec.env} | ({} if turn is None else {"turn": turn})


def _checked_step(spec: RolloutSpec, turn: int, result) -> StepResult:
    """The environment's answer, or an EnvError saying what is wrong with it: a NaN reward would
    otherwise reach the reward op, and a non-string observation the tokenizer, far from its cause."""
    obs, reward = getattr(result, "observation", None), getattr(result, "reward", None)
    if not isinstance(obs, str) or as_reward(reward) is None or not hasattr(result, "done"):
        raise EnvError(f"environment {spec.env!r} step at turn {turn} returned {_quote(result)}; expected a "
                       f"StepResult(observation: str, reward: finite number, done: bool)",
                       trajectory_id=spec.trajectory_id, env=spec.env, turn=turn)
    return result


def _reason(e: Exception) -> str:
    """The text recorded in a failed trajectory's `error`: the exception, and the last frames of what
    raised it (the environment's own code for an EnvError that wraps one)."""
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, PromptTooLongError) or (isinstance(e, EnvError) and e.__cause__ is None):
        return text  # says all there is to say
    cause = e.__cause__ if isinstance(e, EnvError) else e
    return text + "\n" + "".join(traceback.format_exception(cause)[-3:])


async def agent_loop(spec: RolloutSpec, env, engine_loop, tokenizer, max_model_len: int, worker: str = "",
                     state: Partial | None = None, stop=lambda: False) -> Trajectory | Partial:
    """Run one episode to the end, or until `stop()` says to give it back (checked between turns).

    Never raises for the trajectory's own failures. With `state`, resume a shed trajectory: the
    environment is rebuilt by replaying the actions so far (environments are deterministic in seed
    and actions), then the episode goes on from the next turn.
    """
    turns = turn_format(tokenizer)  # plain text, or the tokenizer's chat template (rose.models.turns)
    t0 = time.perf_counter()
    inline = is_inline(type(env))
    first_turn = 0
    traj = spec.trajectory()
    try:
        if state is None:
            first = await env_call(spec, "reset", 0, env.reset, spec.env_seed, inline=inline)
            if not isinstance(first, str):
                raise EnvError(f"environment {spec.env!r} reset returned {_quote(first)}; expected the first "
                               f"observation as a string", trajectory_id=spec.trajectory_id, env=spec.env, turn=0)
            traj.prompt, truth = first, getattr(env, "ground_truth", None)
            traj.ground_truth = None if truth is None else str(truth)
            traj.add_context(turns.prompt(first))
            if len(traj.token_ids) >= max_model_len:
                raise PromptTooLongError(f"prompt of {len(traj.token_ids)} tokens does not fit the model's "
                                         f"context (max_model_len={max_model_len})", trajectory_id=traj.trajectory_id,
                                         env=spec.env)
        else:
            traj, first_turn = state.traj, state.turn
            # One deadline per call replayed: the replay is that many calls in one thread.
            await env_call(spec, "replay", first_turn, replay, env, spec.env_seed, list(traj.actions),
                           timeout_s=spec.env_timeout_s * (1 + len(traj.actions)), inline=inline)
        traj.finish_reason = "max_turns"
        for turn in range(first_turn, env.max_turns):
            if len(traj.token_ids) >= max_model_len:
                traj.finish_reason = "length"
                break
            if stop():
                traj.rollout_s += time.perf_counter() - t0
                return Partial(traj, turn)
            sampling = SamplingSpec(max_tokens=env.max_action_tokens, temperature=spec.temperature,
                                    top_p=spec.top_p, stop_token_ids=turns.stop_ids, seed=spec.turn_seed(turn))
            gen = await generate_turn(engine_loop, traj.token_ids, sampling, f"{traj.trajectory_id}-t{turn}",
                                      spec.request_timeout_s)
            traj.add_generated(gen.token_ids, gen.logprobs, gen.weight_versions)
            traj.turn_workers.append(worker)
            traj.queue_s += gen.queue_s
            action = decode(tokenizer, gen.token_ids)
            traj.actions.append(action)
            result = _checked_step(spec, turn, await env_call(spec, "step", turn, env.step, action, inline=inline))
            traj.env_reward += float(result.reward)
            traj.observations.append(result.observation)
            traj.add_context(turns.after(gen.token_ids, result.observation, bool(result.done)))
            if result.done:
                traj.finish_reason = "done"
                break
    except Exception as e:  # environment, engine or prompt failure: record it, never lose the trajectory
        traj.finish_reason = "failed"
        traj.error = _reason(e)
    traj.rollout_s += time.perf_counter() - t0
    return traj


async def _one(spec: RolloutSpec, w, state, stop) -> Trajectory | Partial:
    from rose.envs import make_env

    if isinstance(state, Trajectory):  # finished before its group was shed
        return state
    try:
        env = await env_call(spec, "construction", None, lambda: make_env(spec.env, **spec.env_kwargs),
                             inline=inline_by_name(spec.env))
    except EnvError as e:
        traj = spec.trajectory(finish_reason="failed", error=_reason(e))
    else:
        host = w.host
        traj = await agent_loop(spec, env, host.engine, host.tokenizer, host.spec.max_model_len, w.address, state,
                                stop)
    return stamp(traj, w) if isinstance(traj, Trajectory) else traj


async def _run_group(specs, states, key: str | None, attempt: int) -> pa.RecordBatch | Continuation:
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    if w.host.engine is None:
        raise RuntimeError(f"worker {w.address} (role {w.role}) has no rollout engine; was it prepared?")
    w.rollout_started(key, sum(not isinstance(s, Trajectory) for s in states))
    try:
        try:
            out = list(await on_engine_loop(w.host.engine, lambda: asyncio.gather(
                *(_one(s, w, st, lambda: w.should_shed(key)) for s, st in zip(specs, states))),
                stall_s=max(s.request_timeout_s for s in specs), handed=lambda: w.rollout_handed(key)))
        except EngineError as e:  # the engine stalled: every unfinished trajectory fails with the reason
            out = failed_group(specs, states, e, w)
        affinity = w.affinity(key)
    finally:
        w.rollout_ended(key)
    if any(isinstance(o, Partial) for o in out):
        return Continuation(key, attempt + 1, tuple(specs), out, affinity)
    return to_batch(out)


async def run_rollout(specs: tuple[RolloutSpec, ...], key: str | None = None,
                      annotations: dict | None = None) -> pa.RecordBatch:
    """Task: run trajectories (normally one GRPO group) concurrently on this worker's engine.

    Returns one RecordBatch with a row per spec, in the order given. When the scheduler asks this worker
    to shed task `key`, the group stops at its next turn boundary, gives its slots back and resumes as
    new rollout tasks (`resume_rollout`, with `annotations` and the trajectories still to run as width)
    wherever the placement puts them, until every trajectory is done; this task waits for them.

    Why here and not in a task of its own after this one: the common case (no shedding) then costs the
    scheduler one task a group, not two (on the Zen 5 host, about 10 ms of a round of 256 guess episodes).
    """
    result = await _run_group(specs, [None] * len(specs), key, 0)
    if isinstance(result, Continuation):
        from rose.runtime.worker.plugin import rose_worker

        rose_worker().yield_slots(key)  # this task holds none from here on: its group runs elsewhere
        result = await _resume(result, key, annotations or {})
    return result


async def resume_rollout(cont: Continuation, key: str) -> pa.RecordBatch | Continuation:
    """Task: go on with a shed group on this worker (it may be shed again: then it returns its
    Continuation, which the group's first task resubmits)."""
    return await _run_group(cont.specs, cont.states, key, cont.attempt)


async def _resume(result: Continuation, key: str, annotations: dict) -> pa.RecordBatch:
    """Resubmit a shed group as a rollout task (same annotations, so the placement plugin parks and places
    it; affinity to the worker that shed it, unless it was shed to move) until it is done. Keys are
    deterministic, so a retried group's task reuses the resume tasks already submitted."""
    import dask
    from distributed import get_client

    client = get_client()
    while isinstance(result, Continuation):
        k = resume_key(key, result.attempt)
        with dask.annotate(**{**annotations, Annotation.WIDTH: max(1, result.width),
                              **({Annotation.AFFINITY: result.worker} if result.worker else {})}):
            fut = client.submit(resume_rollout, result, k, key=k, pure=False, retries=2)
        result = await fut
        fut.release()
    return result
