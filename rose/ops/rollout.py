"""The rollout op: one multi-turn conversation between the policy (a vLLM engine) and an environment.

Each GRPO group is one Dask task (one trajectory per task multiplies Dask's per-task cost, a few
milliseconds, by the group size for no gain: a group is retried, placed and trained on as a whole).
The task runs the agent loop below for each of its trajectories; every policy turn is a request
handed to the worker's engine loop, where it is batched with the turns of every other rollout on that
worker. The task is a coroutine, so Dask runs it on the worker's event loop: a hundred rollouts then
wait on one thread instead of a hundred threads, and the engine thread's kernels do not queue behind them
for the GIL (measured in benchmarks/rollout_overhead.py). The result is an Arrow RecordBatch of the
trajectory schema. Nothing is lost on failure:
an environment that raises or a prompt that does not fit yields a row with finish_reason "failed" and
the error text, and the step goes on.
"""
from __future__ import annotations

import asyncio
import time
import traceback
import zlib
from dataclasses import dataclass, field

import pyarrow as pa

from rose.errors import PromptTooLongError
from rose.runtime.engine.base import SamplingSpec
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

    @property
    def trajectory_id(self) -> str:
        return trajectory_id(self.step, self.group_id, self.sample_id)

    def turn_seed(self, turn: int) -> int:
        return zlib.crc32(f"{self.seed}/{self.trajectory_id}/{turn}".encode())


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


async def agent_loop(spec: RolloutSpec, env, engine_loop, tokenizer, max_model_len: int) -> Trajectory:
    """Run one episode to the end. Never raises for the trajectory's own failures."""
    traj = Trajectory(spec.step, spec.group_id, spec.sample_id, spec.env, spec.env_seed)
    stop_ids = tuple(t for t in (tokenizer.convert_tokens_to_ids("\n"), tokenizer.eos_token_id)
                     if isinstance(t, int) and t != tokenizer.unk_token_id)
    t0 = time.perf_counter()
    try:
        first = env.reset(spec.env_seed)
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        traj.add_context(bos + _encode(tokenizer, first))
        if len(traj.token_ids) >= max_model_len:
            raise PromptTooLongError(f"prompt of {len(traj.token_ids)} tokens does not fit the model's context "
                                     f"(max_model_len={max_model_len})", trajectory_id=traj.trajectory_id)
        traj.finish_reason = "max_turns"
        for turn in range(env.max_turns):
            if len(traj.token_ids) >= max_model_len:
                traj.finish_reason = "length"
                break
            sampling = SamplingSpec(max_tokens=env.max_action_tokens, temperature=spec.temperature,
                                    top_p=spec.top_p, stop_token_ids=stop_ids, seed=spec.turn_seed(turn))
            gen = await asyncio.wrap_future(
                engine_loop.generate(traj.token_ids, sampling, request_id=f"{traj.trajectory_id}-t{turn}"))
            traj.add_generated(gen.token_ids, gen.logprobs, gen.weight_versions)
            traj.queue_s += gen.queue_s
            result = env.step(tokenizer.decode(gen.token_ids, skip_special_tokens=True))
            traj.env_reward += float(result.reward)
            traj.add_context(_encode(tokenizer, result.observation))
            if result.done:
                traj.finish_reason = "done"
                break
    except Exception as e:  # environment or prompt failure: record it, never lose the trajectory
        traj.finish_reason = "failed"
        traj.error = f"{type(e).__name__}: {e}"
        if not isinstance(e, PromptTooLongError):
            traj.error += "\n" + "".join(traceback.format_exception(e)[-3:])
    traj.rollout_s = time.perf_counter() - t0
    return traj


async def _one(spec: RolloutSpec, w) -> Trajectory:
    from rose.ops.envs import make_env

    try:
        env = make_env(spec.env, **spec.env_kwargs)
    except Exception as e:
        traj = Trajectory(spec.step, spec.group_id, spec.sample_id, spec.env, spec.env_seed,
                          finish_reason="failed", error=f"{type(e).__name__}: {e}")
    else:
        traj = await agent_loop(spec, env, w.loop, w.tokenizer, w.spec.max_model_len)
    traj.worker = w.address
    traj.placement = "dedicated" if w.role == "dedicated" else "serving"
    return traj


async def run_rollout(specs: tuple[RolloutSpec, ...]) -> pa.RecordBatch:
    """Task: run trajectories (normally one GRPO group) concurrently on this worker's engine.

    Returns one RecordBatch with a row per spec, in the order given.
    """
    from rose.worker import rose_worker

    w = rose_worker()
    if w.loop is None:
        raise RuntimeError(f"worker {w.address} (role {w.role}) has no rollout engine; was it prepared?")
    return to_batch(list(await asyncio.gather(*(_one(s, w) for s in specs))))
