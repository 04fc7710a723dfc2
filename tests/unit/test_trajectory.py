import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.runtime.trajectory import TRAJECTORY_SCHEMA, Trajectory, concat, flat_tokens, to_batch, with_rewards


@st.composite
def trajectories(draw):
    t = Trajectory(step=draw(st.integers(0, 1000)), group_id=draw(st.integers(0, 64)),
                   sample_id=draw(st.integers(0, 64)), env="guess", env_seed=draw(st.integers(0, 2**40)))
    t.add_context(draw(st.lists(st.integers(0, 500), min_size=1, max_size=8)))
    for _ in range(draw(st.integers(0, 4))):
        n = draw(st.integers(1, 5))
        t.add_generated(draw(st.lists(st.integers(0, 500), min_size=n, max_size=n)),
                        draw(st.lists(st.floats(-20, 0, width=32), min_size=n, max_size=n)),
                        [draw(st.integers(0, 9))] * n)
        t.add_context(draw(st.lists(st.integers(0, 500), max_size=3)))
    t.finish_reason = draw(st.sampled_from(["done", "max_turns", "length", "failed"]))
    t.error = "boom" if t.finish_reason == "failed" else None
    return t


@given(st.lists(trajectories(), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_arrow_round_trip(trajs):
    batch = to_batch(trajs)
    assert batch.schema.equals(TRAJECTORY_SCHEMA)
    # through Arrow IPC, as between processes
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    back = pa.ipc.open_stream(sink.getvalue()).read_all()
    rows = back.to_pylist()
    for t, row in zip(trajs, rows):
        assert row["trajectory_id"] == t.trajectory_id
        assert row["token_ids"] == t.token_ids
        assert row["loss_mask"] == t.loss_mask
        assert row["weight_versions"] == t.weight_versions
        assert row["turn_offsets"] == t.turn_offsets
        assert np.allclose(row["logprobs"], t.logprobs)
        assert len(row["token_ids"]) == len(row["logprobs"]) == len(row["loss_mask"]) == len(row["weight_versions"])
        # context tokens are never marked as trained, nor carry a version
        for m, v in zip(row["loss_mask"], row["weight_versions"]):
            assert m == (v >= 0)
        assert row["error"] == t.error



def test_every_field_lands_in_its_own_column():
    # to_batch builds rows as tuples in the schema's order: a value in the wrong place must show
    t = Trajectory(step=3, group_id=4, sample_id=5, env="guess", env_seed=6, env_kwargs='{"high": 9}',
                   finish_reason="failed", error="boom", worker="tcp://w:1", placement="serving", rollout_s=1.5,
                   queue_s=0.25, prompt="first", ground_truth="7", env_reward=-2.0)
    t.add_context([10, 11])
    t.add_generated([12], [-0.5], [8])
    t.turn_workers.append("tcp://w:2")
    t.actions.append("act")
    t.observations.append("obs")
    (row,) = to_batch([t], rewards=[0.75]).to_pylist()
    assert list(row) == TRAJECTORY_SCHEMA.names
    assert row == {"step": 3, "group_id": 4, "sample_id": 5, "trajectory_id": "s3-g4-i5", "env": "guess",
                   "env_seed": 6, "env_kwargs": '{"high": 9}', "token_ids": [10, 11, 12], "logprobs": [0.0, 0.0, -0.5],
                   "loss_mask": [False, False, True], "weight_versions": [-1, -1, 8], "turn_offsets": [2],
                   "num_turns": 1, "env_reward": -2.0, "reward": 0.75, "finish_reason": "failed", "error": "boom",
                   "worker": "tcp://w:1", "placement": "serving", "turn_workers": ["tcp://w:2"], "rollout_s": 1.5,
                   "queue_s": 0.25, "prompt": "first", "actions": ["act"], "observations": ["obs"],
                   "ground_truth": "7", "reward_terms": []}

def test_flat_tokens_is_zero_copy_into_torch():
    t = Trajectory(0, 0, 0, "guess", 1)
    t.add_context([1, 2, 3])
    t.add_generated([4, 5], [-0.5, -0.25], [0, 0])
    table = pa.Table.from_batches([to_batch([t, t])])  # one chunk, as the trainer sees after concat
    values, offsets = flat_tokens(table, "token_ids")
    arrow_values = table.column("token_ids").chunk(0).values
    assert values.ctypes.data == arrow_values.buffers()[1].address  # numpy view of Arrow's buffer
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer
        tensor = torch.from_numpy(values)
    assert tensor.data_ptr() == arrow_values.buffers()[1].address  # and torch shares it too
    assert offsets.tolist() == [0, 5, 10]
    assert tensor.tolist() == [1, 2, 3, 4, 5] * 2
    lp, _ = flat_tokens(table, "logprobs")
    assert lp.dtype == np.float32 and lp.tolist() == [0, 0, 0, -0.5, -0.25] * 2


def test_with_rewards_and_schema_check():
    t = Trajectory(0, 0, 0, "guess", 1)
    t.add_context([1])
    b = with_rewards(to_batch([t]), [0.5])
    assert b.column("reward").to_pylist() == [0.5]
    bad = pa.RecordBatch.from_pydict({"x": [1]})
    with pytest.raises(ValueError, match="trajectory schema"):
        concat([bad])


def test_dask_weighs_a_batch_by_its_buffers():
    """Dask sizes every task result it keeps or sends; a batch is weighed by its buffers (registered), not
    by `sys.getsizeof`, which walks every column's offsets."""
    from dask.sizeof import sizeof

    t = Trajectory(0, 0, 0, "guess", 1)
    t.add_context(list(range(100)))
    b = to_batch([t] * 8)
    assert sizeof(b) == b.get_total_buffer_size() >= 8 * 100 * 4
