"""Checkpoints: a resumed run continues exactly where it stopped, and a lost trainer is restored from one."""
import json
import os
import signal

import pyarrow.compute as pc
import pytest

import rose
from rose.checkpoint import RunDir
from rose.config import ClusterConfig
from rose.errors import ConfigError
from tests.helpers.faults import corrupt_next_replies
from tests.integration.helpers import FP32, small_pipeline

pytestmark = pytest.mark.integration

# What a step computes (not how long it took): equal to the last bit after a resume.
LEARNING = ["step", "weight_version", "rollout_version", "reward_mean", "reward_std", "trajectories", "failed",
            "tokens", "logprob_mismatch", "loss", "lost", "duplicated"]


def _step(report, step):
    t = report.trajectories
    t = t.filter(pc.equal(t["step"], step)).sort_by("trajectory_id")
    return {c: t[c].to_pylist() for c in ("trajectory_id", "token_ids", "logprobs", "reward")}


def test_a_resumed_run_gives_the_uninterrupted_runs_next_step_bit_for_bit(cluster, tmp_path):
    p = small_pipeline("guess", groups=4, group_size=4, steps=3, checkpoint_every=2)
    whole = rose.run(p, cluster=cluster, progress=False, out=str(tmp_path / "whole"))
    # The same run stopped after step 1 (its last step: checkpointed), then resumed for step 2.
    first = rose.run(p, cluster=cluster, steps=2, progress=False, out=str(tmp_path / "cut"))
    ckpt = RunDir(str(tmp_path / "cut")).latest()
    assert (ckpt.step, ckpt.weight_version) == (1, 2)
    assert {"config.json", "model.safetensors", "tokenizer.json", "trainer.pt"} <= set(os.listdir(ckpt.path))
    resumed = rose.run(p, cluster=cluster, progress=False, resume=str(tmp_path / "cut"))

    assert first.metrics["step"].tolist() == [0, 1]
    assert resumed.metrics["step"].tolist() == [0, 1, 2]  # the history, then the new step appended
    assert resumed.metrics[LEARNING].to_dict("records") == whole.metrics[LEARNING].to_dict("records")
    assert _step(resumed, 2) == _step(whole, 2)
    assert resumed.trajectories.num_rows == whole.trajectories.num_rows
    with open(tmp_path / "cut" / "summary.json") as f:
        assert json.load(f)["steps"] == 3  # the run directory holds the whole run now


def test_resume_refuses_a_different_run(cluster, tmp_path):
    p = small_pipeline("guess", groups=2, group_size=2, steps=1, checkpoint_every=1)
    rose.run(p, cluster=cluster, progress=False, out=str(tmp_path))
    with pytest.raises(ConfigError, match="seed=0, this run has seed=7"):
        rose.run(p, cluster=cluster, progress=False, resume=str(tmp_path), steps=2, seed=7)
    with pytest.raises(ConfigError, match="finished steps 0..0"):
        rose.run(p, cluster=cluster, progress=False, resume=str(tmp_path), steps=1)


def test_a_run_survives_its_trainer_killed_mid_run(tmp_path):
    from distributed import Client

    from rose.fleet import roles_of
    from rose.runtime.cluster import LocalRoseCluster

    p = small_pipeline("guess", groups=4, group_size=4, steps=4, checkpoint_every=2)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1), FP32) as cluster, Client(cluster) as client:
        (victim,) = roles_of(client)["trainer"]
        pid = client.run(os.getpid, workers=[victim])[victim]
        seen = []

        def on_step(row):
            seen.append(row["step"])
            if row["step"] == 1 and len(seen) == 2:  # step 2's sync gets a bad shard, and its row is redone
                client.run(corrupt_next_replies, workers=[victim])
            if row["step"] == 2 and len(seen) == 3:  # after step 2; the last checkpoint is step 1's
                os.kill(pid, signal.SIGKILL)

        report = rose.run(p, cluster=client, on_step=on_step, progress=False, out=str(tmp_path))
        (replacement,) = roles_of(client)["trainer"]
    assert replacement != victim
    assert seen[:3] == [0, 1, 2] and seen[3:] == [2, 3]  # step 2 done again by the restored trainer
    assert report.trainer_restarts == 1 and report.summary["trainer_restarts"] == 1
    # the bad shard was caught in step 2's first sync; the row that counted it was replaced, the count stays
    assert report.shards_refetched == 1 and report.metrics["sync_refetches"].sum() == 0
    assert report.metrics["step"].tolist() == [0, 1, 2, 3]
    assert report.lost == 0 and report.duplicated == 0 and report.summary["failed"] == 0
    # the restored trainer went on from the checkpoint's version, and every version reached the engines
    assert report.metrics["weight_version"].tolist() == [1, 2, 3, 4]
    assert report.metrics["rollout_version"].tolist() == [0, 1, 2, 3]
    assert report.trajectories.num_rows == 4 * 16
