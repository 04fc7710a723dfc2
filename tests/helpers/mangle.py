"""A test-only op that loses one trajectory and repeats another on the way to the trainer: the ledger
must see both."""
import pyarrow as pa

from rose.graph import Op, Ref, TaskSpec, register_op
from rose.graph.lower import task_key
from rose.ops.steps import TRAJECTORIES
from rose.runtime.trajectory import concat


def drop_first_repeat_second(*batches: pa.RecordBatch) -> pa.RecordBatch:
    table = concat(list(batches))
    rows = list(range(1, table.num_rows)) + [1]
    return table.take(rows).combine_chunks().to_batches()[0]


@register_op
class MangleOp(Op):
    name = "test-mangle"
    phase = "reward"
    inputs = {"trajectories": TRAJECTORIES}
    outputs = {"trajectories": TRAJECTORIES}

    def lower(self, node, ctx, inputs):
        key = task_key(ctx, node)
        return [TaskSpec(key, drop_first_repeat_second, tuple(inputs["trajectories"]))], {"trajectories": [Ref(key)]}


def move_and_corrupt(*batches: pa.RecordBatch) -> pa.RecordBatch:
    """The first two trajectories of two turns or more are made to look shed and resumed elsewhere (their
    later turns name another worker); the first of them also gets one observation token changed, as a
    resumed conversation put together wrongly would."""
    table = concat(list(batches))
    rows = table.to_pylist()
    moved = [r for r in rows if len(r["turn_offsets"]) >= 2 and r["finish_reason"] != "failed"][:2]
    for i, r in enumerate(moved):
        r["turn_workers"] = r["turn_workers"][:1] + ["tcp://elsewhere:1"] * (len(r["turn_workers"]) - 1)
        if i == 0:
            at = next(j for j in range(r["turn_offsets"][0], len(r["token_ids"])) if not r["loss_mask"][j])
            r["token_ids"][at] = r["token_ids"][at] + 1
    return pa.Table.from_pylist(rows, schema=table.schema).to_batches()[0]


@register_op
class MoveOp(Op):
    name = "test-move"
    phase = "reward"
    inputs = {"trajectories": TRAJECTORIES}
    outputs = {"trajectories": TRAJECTORIES}

    def lower(self, node, ctx, inputs):
        key = task_key(ctx, node)
        return [TaskSpec(key, move_and_corrupt, tuple(inputs["trajectories"]))], {"trajectories": [Ref(key)]}
