"""What a run returns: per-step metrics, every trajectory, a summary, and a plot."""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# The columns of `Report.metrics`, one row per step. Seconds: rollout_s (submission, or the end of the
# sync bringing its weights if that came later, to the last rollout done), train_s (from when training
# could start to its metrics), trainer_compute_s (inside the train step), sync_s (from its submission, or the
# driver's look if later, to its statuses; a sync submitted while the next step's rollouts ran: its own
# time less its wait for them), step_s (one step's share of the run's wall time). rollout_version: the
# weights its rollouts ran on; weight_version: the weights its train step made. lost / duplicated: the
# step's trajectory ledger (`rose.ledger`): planned ids its train op never received / extra rows it
# received. workers_lost: rollout workers that left the run during the step. provenance_checked:
# trajectories shed and resumed on another worker whose environment the trainer replayed
# (`rose.envs.provenance`); those that did not replay are `failed`, with the reason.
# lr: the learning rate of the step's update (`GRPOConfig.lr_at`). kl: the token mean of the KL
# penalty's k3 against the starting weights in the update's last inner epoch (`GRPOConfig.kl_coef`; NaN
# where the penalty is off). groups_sampled: GRPO groups rolled
# out; groups_varied: those whose rewards varied (the rest teach nothing); sample_rounds: rollout rounds
# the step took (dynamic sampling rolls out more until enough groups vary: demand varies by step).
STEP_COLUMNS = ["step", "weight_version", "rollout_version", "reward_mean", "reward_std", "trajectories", "failed",
                "tokens", "rollout_s", "train_s", "trainer_compute_s", "sync_s", "step_s", "rollout_tok_s",
                "logprob_mismatch", "loss", "kl", "lr", "sync_bytes", "sync_refetches", "lost", "duplicated",
                "workers_lost", "provenance_checked", "groups_sampled", "groups_varied", "sample_rounds"]


def step_row(step: int, version: int, table: pa.Table, metrics: dict, rollout_s: float, train_s: float,
             sync_s: float) -> dict:
    """A step's metrics row (without step_s, rollout_version and the sync counters, which the runner adds)."""
    fr = np.asarray(table["finish_reason"].to_pylist())
    rewards = table["reward"].to_numpy(zero_copy_only=False)
    ok = fr != "failed"
    masks = table["loss_mask"].combine_chunks()
    tokens = int(np.asarray(masks.values.to_numpy(zero_copy_only=False)).sum())
    # A failed trajectory earns nothing and counts as 0: averaged over the survivors alone, a step where
    # most trajectories failed would read as well as the few that finished.
    earned = np.where(ok, rewards, 0.0)
    return {"step": step, "weight_version": version,
            "reward_mean": float(np.mean(earned)) if len(earned) else float("nan"),
            "reward_std": float(np.std(earned)) if len(earned) else float("nan"),
            "trajectories": table.num_rows, "failed": int((~ok).sum()), "tokens": tokens,
            "rollout_s": rollout_s, "train_s": train_s, "trainer_compute_s": metrics.get("train_s", float("nan")),
            "sync_s": sync_s,
            "rollout_tok_s": tokens / rollout_s if rollout_s > 0 else float("nan"),
            "logprob_mismatch": metrics.get("logprob_mismatch", float("nan")),
            "loss": metrics.get("loss", float("nan")), "kl": metrics.get("kl", float("nan")),
            "lr": metrics.get("lr", float("nan")), **term_means(table)}


def metrics_frame(rows: list[dict]) -> pd.DataFrame:
    """Step rows as the report's frame: STEP_COLUMNS, then the reward/<name> columns of any reward terms."""
    terms = sorted({k for r in rows for k in r} - set(STEP_COLUMNS))
    return pd.DataFrame(rows, columns=STEP_COLUMNS + terms)


def term_means(table: pa.Table) -> dict[str, float]:
    """{"reward/<name>": mean over the trajectories scored} for each term of a combined reward."""
    sums: dict[str, list[float]] = {}
    for row in table["reward_terms"].to_pylist():
        for name, v in row or ():
            sums.setdefault(name, []).append(v)
    return {f"reward/{name}": float(np.mean(v)) for name, v in sorted(sums.items())}


@dataclass
class Report:
    pipeline: str
    metrics: pd.DataFrame  # one row per step, STEP_COLUMNS, then reward/<name> per term of a combined reward
    trajectories: pa.Table  # every trajectory of the run, trajectory schema
    lost: int  # trajectory ids planned but never received by a train op (the ledger; sum over steps)
    duplicated: int  # extra rows a train op received: an id again, or one never planned
    workers_lost: int = 0  # rollout workers that left during the run (each replaced or waited out)
    trainer_restarts: int = 0  # trainer workers lost and replaced from a checkpoint during the run
    # Shard replies that failed their hash check and were fetched again, over every sync of the run,
    # with those of steps a trainer loss made the run redo (their rows are replaced in `metrics`).
    shards_refetched: int = 0
    prepare_s: float = 0.0  # s spent preparing workers (engine builds, trainer loads) before the steps

    @property
    def summary(self) -> dict:
        m = self.metrics
        n = len(m)

        def block(rows: pd.DataFrame) -> float:  # mean reward over a block of steps, rounded for the line
            return round(float(rows["reward_mean"].mean()), 4) if len(rows) else float("nan")

        failed = int((pa.compute.equal(self.trajectories["finish_reason"], "failed")).to_numpy(
            zero_copy_only=False).sum()) if self.trajectories.num_rows else 0
        # Five-step blocks show the start and end of a short run; ten-step blocks are what a claim of
        # learning rests on (a step's mean over 128 samples moves by ~0.03 from sampling alone).
        # steps_s: the steps' wall time, worker preparation (engine builds, in step 0) included; cluster
        # start and the tiny model's build and warm start excluded.
        return {"pipeline": self.pipeline, "steps": n, "reward_first5": block(m.head(5)),
                "reward_last5": block(m.tail(5)), "reward_first10": block(m.head(10)),
                "reward_last10": block(m.tail(10)),
                "steps_s": round(float(m["step_s"].sum()), 1) if n else float("nan"),
                "prepare_s": round(self.prepare_s, 1),
                "trajectories": self.trajectories.num_rows, "failed": failed,
                "lost": self.lost, "duplicated": self.duplicated, "workers_lost": self.workers_lost,
                "trainer_restarts": self.trainer_restarts, "shards_refetched": self.shards_refetched,
                "logprob_mismatch": round(float(m["logprob_mismatch"].mean()), 6) if n else float("nan")}

    def plot(self, path: str) -> str:
        """Write a PNG: the reward curve and the per-step time breakdown. Returns `path`."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        m = self.metrics
        # Worker preparation (tens of seconds of engine builds) in a panel of its own: on the steps'
        # axis it would flatten them.
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(12, 4), gridspec_kw={"width_ratios": [5, 5, 1]})
        # Per-trajectory rewards spread widely (a std band would hide the trend): show each step's
        # mean and a 10-step moving average.
        ax1.plot(m["step"], m["reward_mean"], marker="o", ms=2, lw=0.8, alpha=0.6, label="mean reward")
        ax1.plot(m["step"], m["reward_mean"].rolling(10, min_periods=1).mean(), lw=2.2, label="10-step average")
        ax1.set_xlabel("step")
        ax1.set_ylabel("reward")
        ax1.set_title(f"{self.pipeline}: reward")
        ax1.legend()
        bottom = None
        for col, label in (("rollout_s", "rollout"), ("train_s", "train"), ("sync_s", "sync")):
            ax2.bar(m["step"], m[col], bottom=bottom, label=label)
            bottom = m[col] if bottom is None else bottom + m[col]
        ax2.set_xlabel("step")
        ax2.set_ylabel("seconds")
        ax2.set_title("step time")
        ax2.legend()
        ax3.bar(["workers"], [self.prepare_s], color="grey")
        ax3.set_title(f"preparation\n{self.prepare_s:.1f} s")
        ax3.set_ylabel("seconds")
        fig.tight_layout()
        fig.savefig(path, dpi=100, format="png")  # `path` may be a temporary name
        plt.close(fig)
        return path

    def save(self, out_dir: str, plot: bool = True) -> dict[str, str]:
        """Write metrics.csv, trajectories.parquet, summary.json and (`plot`) reward.png under `out_dir`.
        Returns the paths written. Each file is written beside and renamed over the old one: a run
        killed mid-save (at a checkpoint, the report a resume reads) leaves every file whole, the old
        one or the new, and each holds at least the steps of the checkpoint before."""
        os.makedirs(out_dir, exist_ok=True)
        paths = {"metrics": os.path.join(out_dir, "metrics.csv"),
                 "trajectories": os.path.join(out_dir, "trajectories.parquet"),
                 "summary": os.path.join(out_dir, "summary.json")}
        _replace(paths["trajectories"], lambda tmp: pq.write_table(self.trajectories, tmp))
        _replace(paths["metrics"], lambda tmp: self.metrics.to_csv(tmp, index=False))
        summary = json.dumps(self.summary, indent=2)
        _replace(paths["summary"], lambda tmp: _write_text(tmp, summary))
        if plot:
            paths["plot"] = os.path.join(out_dir, "reward.png")
            _replace(paths["plot"], self.plot)
        return paths


def _replace(path: str, write) -> None:
    """`write(tmp)` a file beside `path`, then rename it over `path` (atomic on one filesystem); on an
    error `path` is left as it was and the partial file removed."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
