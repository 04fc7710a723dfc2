"""Experiment tracking: each step's scalars, and the run's settings as parameters, sent to TensorBoard,
MLflow or Weights & Biases through each project's own library (`rose run --track NAME`,
`rose.run(track=[...])`). The per-step table and `metrics.csv` hold the same scalars.

- tensorboard: event files under `DIR/tensorboard` (`tensorboard --logdir DIR/tensorboard`).
- mlflow: a run in experiment `rose-PIPELINE` at $MLFLOW_TRACKING_URI, or a local file store in
  `DIR/mlruns` (`mlflow ui --backend-store-uri DIR/mlruns`).
- wandb: offline by default (`DIR/wandb`; `wandb sync` uploads it); WANDB_MODE=online to send as it runs.

DIR is the run directory (`--out`; `runs/PIPELINE` when rose.run has none). A step a lost trainer made
the run redo is logged again at the same step.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

from rose.errors import ConfigError

TRACKERS = ("tensorboard", "mlflow", "wandb")
_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny (or mlflow)", "wandb": "wandb"}


def scalars(row: dict) -> dict[str, float]:
    """The finite numbers of a step's metrics row, by name (the step itself is the x axis)."""
    out = {}
    for k, v in row.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


def settings(pipeline) -> dict[str, str]:
    """The run's settings, flattened to `section.field` -> text: the pipeline's fields, its model,
    engine and cluster configs, and the step graph's train config (step 0's)."""
    flat: dict[str, str] = {}

    def put(prefix: str, value) -> None:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                put(f"{prefix}.{f.name}" if prefix else f.name, getattr(value, f.name))
        elif not callable(value):
            flat[prefix] = value if isinstance(value, str) else json.dumps(value, default=str)

    put("", pipeline)
    for node in pipeline.build(0).nodes.values():
        if node.op == "train" and "grpo" in node.params:
            put(f"train.{node.name}", node.params["grpo"])
    return flat


class _TensorBoard:
    def __init__(self, root: str, name: str, params: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=os.path.join(root, "tensorboard"))
        table = "\n".join(f"| {k} | {v} |" for k, v in params.items())
        self.writer.add_text("settings", f"| setting | value |\n|---|---|\n{table}", 0)

    def log(self, step: int, values: dict) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self, ok: bool) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, root: str, name: str, params: dict):
        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # The local file store needs no database packages; MLflow 3 asks to be told it is wanted.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri("file:" + os.path.abspath(os.path.join(root, "mlruns")))
        mlflow.set_experiment(f"rose-{name}")
        self.run = mlflow.start_run(run_name=name)
        # MLflow caps a parameter's value at 6000 characters (a long reward spec, say)
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})

    def log(self, step: int, values: dict) -> None:
        # MLflow metric names allow letters, digits and _-./ and spaces: a reward term's name may not
        self.mlflow.log_metrics({_mlflow_name(k): v for k, v in values.items()}, step=step)

    def close(self, ok: bool) -> None:
        self.mlflow.end_run(status="FINISHED" if ok else "FAILED")


def _mlflow_name(key: str) -> str:
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


class _WandB:
    def __init__(self, root: str, name: str, params: dict):
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")
        self.run = wandb.init(project=f"rose-{name}", name=name, dir=root, config=params)

    def log(self, step: int, values: dict) -> None:
        self.run.log(values, step=step)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


_KINDS = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}


class Tracking:
    """The trackers of one run. `log(row)` after each step; `close(ok)` at the end."""

    def __init__(self, names, pipeline, root: str):
        names = [names] if isinstance(names, str) else list(names or ())
        for n in names:
            if n not in TRACKERS:
                raise ConfigError(f"track={n!r} is not allowed: one of {TRACKERS}")
        self.trackers = []
        if not names:
            return
        os.makedirs(root, exist_ok=True)
        params = settings(pipeline)
        for n in dict.fromkeys(names):
            try:
                self.trackers.append(_KINDS[n](root, pipeline.name, params))
            except ImportError as e:
                self.close(False)
                raise ConfigError(f"--track {n} needs the {_PACKAGES[n]} package ({e}); install it into this "
                                  f"environment, e.g. `pip install {_PACKAGES[n].split()[0]}`") from None

    def log(self, row: dict) -> None:
        values = scalars(row)
        for t in self.trackers:
            t.log(int(row["step"]), values)

    def close(self, ok: bool) -> None:
        for t in self.trackers:
            t.close(ok)
        self.trackers = []
