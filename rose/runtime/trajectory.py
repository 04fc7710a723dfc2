"""The trajectory schema: one Arrow row per trajectory. Versioned; every op speaks it.

Token-level columns are aligned: `token_ids[i]`, `logprobs[i]`, `loss_mask[i]` and
`weight_versions[i]` all describe token i of the whole conversation (prompt included).
Prompt and environment tokens have `loss_mask=False`, `logprobs=0` and `weight_versions=-1`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from dask.sizeof import sizeof

SCHEMA_VERSION = 4  # 2: turn_workers; 3: env_kwargs; 4: prompt, actions, observations, ground_truth, reward_terms

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int32()),  # RL step that asked for this trajectory
        pa.field("group_id", pa.int32()),  # GRPO group within the step (same env seed)
        pa.field("sample_id", pa.int32()),  # index within the group
        pa.field("trajectory_id", pa.string()),  # unique, stable across retries: "s{step}-g{group}-i{sample}"
        pa.field("env", pa.string()),  # environment name
        pa.field("env_seed", pa.int64()),  # seed passed to Env.reset
        # the kwargs the environment was built with, as a JSON object (a replay needs them: provenance)
        pa.field("env_kwargs", pa.string()),
        pa.field("token_ids", pa.list_(pa.int32())),  # (T,) whole conversation
        pa.field("logprobs", pa.list_(pa.float32())),  # (T,) behaviour-policy log-prob, 0 where not generated
        pa.field("loss_mask", pa.list_(pa.bool_())),  # (T,) true only on policy-generated tokens
        pa.field("weight_versions", pa.list_(pa.int32())),  # (T,) version that produced the token, -1 if none
        pa.field("turn_offsets", pa.list_(pa.int32())),  # start index of each policy turn in token_ids
        pa.field("num_turns", pa.int32()),
        pa.field("env_reward", pa.float32()),  # sum of the rewards the environment gave
        pa.field("reward", pa.float32()),  # filled by the reward op; NaN until then
        pa.field("finish_reason", pa.string()),  # done | max_turns | length | failed
        pa.field("error", pa.string()),  # exception text when finish_reason == "failed", else null
        pa.field("worker", pa.string()),  # address of the worker that generated it
        pa.field("placement", pa.string()),  # dedicated | serving (of `worker`)
        # (num_turns,) address of the worker whose engine generated each policy turn: a rollout shed by
        # a serving worker and resumed elsewhere names both
        pa.field("turn_workers", pa.list_(pa.string())),
        pa.field("rollout_s", pa.float32()),  # wall seconds from first request to last token
        pa.field("queue_s", pa.float32()),  # seconds the turns waited in the engine before their first token
        # The conversation as text, for reward functions and for reading: the environment's first
        # observation; (num_turns,) each policy turn decoded; the environment's reply to each action
        # (one per action the environment answered: a failed step leaves one fewer).
        pa.field("prompt", pa.string()),
        pa.field("actions", pa.list_(pa.string())),
        pa.field("observations", pa.list_(pa.string())),
        # The environment's answer for this episode (`Env.ground_truth` after reset), null if it has none
        pa.field("ground_truth", pa.string()),
        # Each named term of a combined reward (`rose.Rewards`), before weighting; empty otherwise
        pa.field("reward_terms", pa.map_(pa.string(), pa.float32())),
    ],
    metadata={b"rose.trajectory.schema_version": str(SCHEMA_VERSION).encode()},
)

@dataclass
class Trajectory:
    """A trajectory being built by the agent loop (mutable; becomes one Arrow row)."""

    step: int
    group_id: int
    sample_id: int
    env: str
    env_seed: int
    env_kwargs: str = "{}"  # JSON object: the kwargs the environment was built with
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    turn_offsets: list[int] = field(default_factory=list)
    env_reward: float = 0.0  # sum of rewards the environment gave
    finish_reason: str = "done"
    error: str | None = None
    worker: str = ""
    placement: str = "dedicated"
    turn_workers: list[str] = field(default_factory=list)  # per policy turn
    rollout_s: float = 0.0
    queue_s: float = 0.0
    prompt: str = ""  # the environment's first observation
    actions: list[str] = field(default_factory=list)  # per policy turn, decoded
    observations: list[str] = field(default_factory=list)  # the environment's reply to each action
    ground_truth: str | None = None  # Env.ground_truth after reset, if the environment has one

    @property
    def trajectory_id(self) -> str:
        return trajectory_id(self.step, self.group_id, self.sample_id)

    def add_context(self, token_ids: list[int]) -> None:
        """Append prompt or environment tokens (not trained on)."""
        self.token_ids += token_ids
        self.logprobs += [0.0] * len(token_ids)
        self.loss_mask += [False] * len(token_ids)
        self.weight_versions += [-1] * len(token_ids)

    def add_generated(self, token_ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        """Append one policy turn's tokens with their behaviour log-probs and weight versions."""
        assert len(token_ids) == len(logprobs) == len(versions)
        self.turn_offsets.append(len(self.token_ids))
        self.token_ids += token_ids
        self.logprobs += logprobs
        self.loss_mask += [True] * len(token_ids)
        self.weight_versions += versions


def trajectory_id(step: int, group_id: int, sample_id: int) -> str:
    return f"s{step}-g{group_id}-i{sample_id}"


_ROW = pa.struct(list(TRAJECTORY_SCHEMA))  # one trajectory: the schema's fields, in order


def to_batch(trajs: list[Trajectory], rewards: list[float] | None = None) -> pa.RecordBatch:
    """Trajectories -> one RecordBatch of TRAJECTORY_SCHEMA. `rewards` defaults to NaN.

    Each trajectory is one tuple in the schema's field order, converted as one struct array: 73 µs for a
    group of 8 three-turn trajectories, against 129 µs for a dict of column lists (the rollout task of
    every group builds one, on the worker that runs its engine)."""
    if rewards is None:
        rewards = [float("nan")] * len(trajs)
    rows = [(t.step, t.group_id, t.sample_id, t.trajectory_id, t.env, t.env_seed, t.env_kwargs, t.token_ids,
             t.logprobs, t.loss_mask, t.weight_versions, t.turn_offsets, len(t.turn_offsets), t.env_reward, r,
             t.finish_reason, t.error, t.worker, t.placement, t.turn_workers, t.rollout_s, t.queue_s, t.prompt,
             t.actions, t.observations, t.ground_truth, [])  # the last: reward_terms, filled by the reward op
            for t, r in zip(trajs, rewards, strict=True)]
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW))
    return batch.replace_schema_metadata(TRAJECTORY_SCHEMA.metadata)


def upgrade(table: pa.Table) -> pa.Table:
    """A table of an older trajectory schema (a run directory written before) in this one: columns added
    since are filled empty (text "", lists and maps empty, anything else null). ValueError if it has a
    column this schema lacks or one of another type."""
    empty = {pa.types.is_string: "", pa.types.is_list: [], pa.types.is_map: []}
    cols = []
    for f in TRAJECTORY_SCHEMA:
        if f.name in table.column_names:
            cols.append(table[f.name].cast(f.type))
            continue
        fill = None if f.name == "ground_truth" else next((v for test, v in empty.items() if test(f.type)), None)
        cols.append(pa.array([fill] * table.num_rows, f.type))
    extra = set(table.column_names) - set(TRAJECTORY_SCHEMA.names)
    if extra:
        raise ValueError(f"trajectories have columns {sorted(extra)} that schema v{SCHEMA_VERSION} lacks")
    return pa.Table.from_arrays(cols, schema=TRAJECTORY_SCHEMA)


def concat(batches: list[pa.RecordBatch]) -> pa.Table:
    """Batches of TRAJECTORY_SCHEMA -> one Table (checks the schema)."""
    for b in batches:
        if not b.schema.equals(TRAJECTORY_SCHEMA, check_metadata=False):
            raise ValueError(f"batch does not have the trajectory schema v{SCHEMA_VERSION}: {b.schema}")
    return pa.Table.from_batches(batches, schema=TRAJECTORY_SCHEMA)


@sizeof.register(pa.RecordBatch)
def _batch_nbytes(batch: pa.RecordBatch) -> int:
    """Dask's size of a batch, as it weighs every task result it keeps or sends: the bytes of its buffers.
    Unregistered, Dask asked `sys.getsizeof`, which walks every column's offsets (`nbytes`): 43 us a
    guess group's batch against 1.4, on every rollout task's result as it finishes and as it is sent (py-spy
    showed both), on the worker's event loop."""
    return batch.get_total_buffer_size()


def with_rewards(batch: pa.RecordBatch | pa.Table, rewards,
                 terms: list[dict] | None = None) -> pa.RecordBatch | pa.Table:
    """Return `batch` with its reward column replaced (float32, one per row), and with `terms` (one dict
    name -> value per row) its reward_terms column too."""
    idx = batch.schema.get_field_index("reward")
    out = batch.set_column(idx, "reward", pa.array(np.asarray(rewards, dtype=np.float32)))
    if terms is not None:
        field_ = TRAJECTORY_SCHEMA.field("reward_terms")
        out = out.set_column(out.schema.get_field_index("reward_terms"), field_,
                             pa.array([list(t.items()) for t in terms], field_.type))
    return out


def mark_failed(table: pa.Table, reasons: dict[str, str]) -> pa.Table:
    """`table` with the trajectories named in `reasons` (trajectory id -> why) marked failed."""
    if not reasons:
        return table
    ids = table["trajectory_id"].to_pylist()
    finish = [("failed" if i in reasons else f) for i, f in zip(ids, table["finish_reason"].to_pylist())]
    error = [reasons.get(i, e) for i, e in zip(ids, table["error"].to_pylist())]
    table = table.set_column(table.schema.get_field_index("finish_reason"), "finish_reason", pa.array(finish))
    return table.set_column(table.schema.get_field_index("error"), "error", pa.array(error, pa.string()))


def flat_tokens(table: pa.Table | pa.RecordBatch, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column -> (values (sum T,), offsets (rows+1,)) as numpy views without copying.

    The values buffer is shared with Arrow when the column has one chunk and no nulls; torch
    can wrap it with `torch.from_numpy` (zero-copy; the array is read-only).
    """
    col = table.column(column)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    offsets = col.offsets.to_numpy(zero_copy_only=True)
    values = col.values
    if pa.types.is_boolean(values.type):
        return values.to_numpy(zero_copy_only=False), offsets  # bools are bit-packed in Arrow
    return values.to_numpy(zero_copy_only=True), offsets
