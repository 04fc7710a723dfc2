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
