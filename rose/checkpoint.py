"""A run's directory and its checkpoints, on the driver's side.

    RUN_DIR/metrics.csv, trajectories.parquet, summary.json   (the Report, `Report.save`; reward.png at the end)
    RUN_DIR/checkpoints/step-000009-1a2b3c4d/     a model directory + trainer.pt (written by the trainer)
    RUN_DIR/checkpoints/latest.json               which checkpoint a resume starts from

A checkpoint counts only once `latest.json` names it, and that file is replaced atomically (written
beside, then renamed) after both the trainer's directory (itself written beside and renamed) and the
report up to the same step are on disk: a crash at any point leaves the previous checkpoint whole and
named. Where the prompt stream stands is the step: a step's prompts are a function of (seed, step).
The trainer writes into the run directory by path, so on a cluster it must be storage the trainer
workers share with the driver (a replacement trainer on another host restores from it).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rose.errors import ConfigError
from rose.runtime.trajectory import upgrade

LATEST = "latest.json"
KEEP = 2  # checkpoint directories kept: the latest and the one before


@dataclass(frozen=True)
class Checkpoint:
    step: int  # the last step whose training it holds; a resume starts at step + 1
    weight_version: int  # the version of its weights
    path: str  # the trainer's directory (a model directory + trainer.pt)
    pipeline: str  # name of the pipeline that wrote it
    seed: int  # the run's seed
    staleness: int  # 0 synchronous, 1 asynchronous


class RunDir:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.checkpoints = os.path.join(self.root, "checkpoints")

    def new_path(self, step: int) -> str:
        """A fresh directory name for step `step`'s checkpoint (unique: a step redone after a trainer
        was replaced never writes over the checkpoint `latest.json` still names)."""
        os.makedirs(self.checkpoints, exist_ok=True)
        return os.path.join(self.checkpoints, f"step-{step:06d}-{uuid.uuid4().hex[:8]}")

    def latest(self) -> Checkpoint | None:
        path = os.path.join(self.checkpoints, LATEST)
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            ckpt = Checkpoint(**json.load(f))
        if not os.path.isdir(ckpt.path):
            raise ConfigError(f"{path} names checkpoint {ckpt.path!r}, which does not exist")
        return ckpt

    def commit(self, ckpt: Checkpoint) -> None:
        """Make `ckpt` the one a resume starts from; drop older checkpoint directories but the last KEEP."""
        path = os.path.join(self.checkpoints, LATEST)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(ckpt), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        kept = sorted((d for d in os.listdir(self.checkpoints) if d.startswith("step-") and "." not in d),
                      key=lambda d: os.path.getmtime(os.path.join(self.checkpoints, d)))
        for d in kept[:-KEEP]:
            if os.path.join(self.checkpoints, d) != ckpt.path:
                shutil.rmtree(os.path.join(self.checkpoints, d), ignore_errors=True)

    def resume_point(self, pipeline: str, seed: int, staleness: int) -> Checkpoint:
        """The latest checkpoint, checked against the run being resumed."""
        ckpt = self.latest()
        if ckpt is None:
            raise ConfigError(f"cannot resume from {self.root!r}: it has no checkpoint ({self.checkpoints}/{LATEST}); "
                              "checkpoints are written every `checkpoint_every` steps")
        for field, have, want in (("pipeline", ckpt.pipeline, pipeline), ("seed", ckpt.seed, seed),
                                  ("staleness", ckpt.staleness, staleness)):
            if have != want:
                raise ConfigError(f"cannot resume from {self.root!r}: its checkpoint was written with {field}="
                                  f"{have!r}, this run has {field}={want!r}")
        return ckpt

    def history(self, upto_step: int) -> tuple[list[dict], list[pa.Table]]:
        """The metrics rows and trajectories of steps 0..`upto_step` as the run directory holds them
        (steps after a checkpoint are dropped: the resumed run does them again)."""
        metrics = os.path.join(self.root, "metrics.csv")
        trajectories = os.path.join(self.root, "trajectories.parquet")
        if not (os.path.isfile(metrics) and os.path.isfile(trajectories)):
            raise ConfigError(f"cannot resume from {self.root!r}: metrics.csv or trajectories.parquet is missing")
        frame = pd.read_csv(metrics)
        rows = frame[frame["step"] <= upto_step].to_dict("records")
        table = upgrade(pq.read_table(trajectories))  # a run written by an older ROSE: its columns, filled
        table = table.filter(pc.less_equal(table["step"], upto_step))
        if sorted(r["step"] for r in rows) != list(range(upto_step + 1)):
            raise ConfigError(f"cannot resume from {self.root!r}: metrics.csv lacks steps of 0..{upto_step}")
        return rows, [table]
