"""The train op (on the trainer worker) and the sync op (driven from the trainer).

After each update the trainer publishes the new version as hashed shards (in the engines' dtype);
the sync op then moves only what changed to every rollout worker (`rose.runtime.weights`).
"""
from __future__ import annotations

import pyarrow as pa

from rose.config import GRPOConfig
from rose.runtime.trajectory import concat


def train_step(cfg: GRPOConfig, *batches: pa.RecordBatch, after: dict | None = None) -> dict:
    """Task: one GRPO update on all of the step's trajectories, then publish. Returns version, metrics.
    The publish waits for the sync of the version before it while that sync still runs (asynchronous
    mode: this step trained alongside the previous step's sync; `WeightEndpoint.publish`). `after`: the
    previous step's train result, where this task was submitted before that step's train ended (a Dask
    dependency that orders the two: `Step.submit_train_after`); not read."""
    import time

    from rose.runtime.worker import trainer_group as group
    from rose.runtime.worker.plugin import rose_worker
    from rose.runtime.worker.trainer import TrainerHost

    w = rose_worker()
    if not isinstance(w.host, TrainerHost) or w.host.trainer is None:
        raise RuntimeError(f"worker {w.address} (role {w.role}) holds no trainer; was it prepared?")
    trainer = w.host.trainer
    table = concat(list(batches))
    table, checked, bad = _check_provenance(table, w.host.tokenizer)
    # A sharded trainer's other ranks train on the same (checked) rows, each on its share.
    peers = group.submit_to_peers(w.host.peers, group.peer_train, table, cfg) if w.host.peers else []
    before = trainer.version
    with group.peer_errors(peers, w.host.peers):
        metrics = trainer.step(table, cfg)
    metrics["provenance_checked"], metrics["provenance_failed"] = checked, bad
    # What the trainer received, row by row: the driver's ledger checks it against what was planned.
    metrics["trajectory_ids"] = table["trajectory_id"].to_pylist()
    if trainer.version != before:
        t0 = time.perf_counter()
        with group.peer_errors(peers, w.host.peers):
            w.host.publish()  # sharded: every rank publishes its own shards
        metrics["publish_wait_s"] = w.weights.publish_wait_s
        metrics["publish_s"] = time.perf_counter() - t0 - w.weights.publish_wait_s
        metrics["publish_host_bytes"] = w.host.publisher.host_bytes
    group.wait_for_peers(peers)
    metrics["trainer_ranks"] = 1 + len(w.host.peers)
    return {"version": trainer.version, "metrics": metrics}


def _check_provenance(table: pa.Table, tokenizer) -> tuple[pa.Table, int, dict[str, str]]:
    """Replay the environment of every trajectory that was shed and resumed on another worker (its
    turns name more than one worker) and mark the ones whose recorded conversation it does not
    reproduce failed, before they are trained on. Returns (table, rows checked, {id: reason})."""
    import logging

    import pyarrow.compute as pc

    from rose.envs.provenance import check_provenance
    from rose.runtime.trajectory import mark_failed

    moved = pa.array([len(set(ws)) > 1 for ws in table["turn_workers"].to_pylist()], pa.bool_())
    subset = table.filter(pc.and_(moved, pc.not_equal(table["finish_reason"], "failed")))
    if tokenizer is None or subset.num_rows == 0:
        return table, 0, {}
    found = check_provenance(subset, tokenizer)
    # An environment the trainer cannot build (not importable here) is unchecked, not corrupt.
    bad = {tid: f"provenance: {why}" for tid, why in found if not why.startswith("cannot replay")}
    if len(bad) != len(found):
        logging.getLogger("rose.run").warning("provenance of %d trajectories not checked: %s", len(found) - len(bad),
                                              next(why for _, why in found if why.startswith("cannot replay")))
    if bad:
        logging.getLogger("rose.run").error("%d resumed trajectories do not replay; not trained on: %s", len(bad), bad)
    return mark_failed(table, bad), subset.num_rows, bad


def train_metrics(result: dict) -> dict:
    """Task: the metrics of a train result (what the driver gathers)."""
    return dict(result["metrics"])


async def sync_weights(result: dict, receivers: tuple[str, ...], after: tuple[str, ...] = ()) -> dict:
    """Task (on the trainer): bring every rollout worker in `receivers` to the trained version. `after`:
    keys of rollout tasks a receiver must not be running, nor able to run again, when it commits the
    version (the next step's rollouts, where this sync was submitted while they run:
    `Step.submit_sync_after`); the version is staged meanwhile. The placement plugin's scheduler answers
    the wait, for each receiver (`rose_keys_done`)."""
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    ready = (lambda addr: w.worker.scheduler.rose_keys_done(keys=list(after), worker=addr)) if after else None
    try:
        if w.weights.version != result["version"]:
            raise RuntimeError(f"trainer publishes version {w.weights.version}, the train step made "
                               f"{result['version']}")
        status = await _sync_alive(w, receivers, ready)
    except BaseException as e:
        w.weights.mark_synced(result["version"], error=f"{type(e).__name__}: {e}")
        raise
    w.weights.mark_synced(result["version"])
    return status


SYNC_ATTEMPTS = 3  # syncs tried while receivers keep leaving, or their engines failing, mid-sync


async def _sync_alive(w, receivers: tuple[str, ...], ready=None) -> dict:
    """Sync to the receivers still in the cluster whose engines take versions. Receivers that left since
    the step was planned are skipped (Dask re-placed their rollouts); one that leaves during the sync
    fails that attempt, and the sync is run again to those left (receivers it already reached are at the
    version and skipped). A receiver whose engine is unusable (a weight load into it raised part way,
    in this sync or before) is left out too, and named in the result's "unusable": a dedicated worker
    restarts and joins again, a serving worker serves on without rollouts (`RoseWorker._check_unusable`)."""
    import asyncio
    import logging

    from rose.runtime.weights.sync import receiver_states, sync_to

    log = logging.getLogger("rose.weights")
    refetched = 0  # bad shards caught in attempts that then failed: still caught, still counted
    unusable: dict[str, str] = {}  # receiver -> why its engine takes no more versions
    for attempt in range(1, SYNC_ATTEMPTS + 1):
        info = await w.worker.scheduler.identity(n_workers=-1)
        alive = [r for r in receivers if r in info["workers"] and r not in unusable]
        counts: dict[str, int] = {}
        try:
            before = await receiver_states(w.worker, alive)  # read once: the sync starts from it
            out = {a: s["unusable"] for a, s in zip(alive, before) if s.get("unusable")}
            if out:
                log.error("sync leaves out %d receivers whose engines are unusable: %s", len(out),
                          "; ".join(f"{a}: {why}" for a, why in out.items()))
                unusable |= out
                alive, before = [a for a in alive if a not in out], [s for s in before if not s.get("unusable")]
            counts = {a: s["refetches"] for a, s in zip(alive, before)}
            status = await sync_to(w.worker, w.weights, alive, before=before, ready=ready)
            return status | {"refetches": status.get("refetches", 0) + refetched, "unusable": unusable}
        except Exception as e:
            after = await _states(w.worker, alive) if counts else {}
            refetched += sum(after[a]["refetches"] - counts[a] for a in after if a in counts)
            broke = [a for a, st in after.items() if st.get("unusable")]
            left = []
            # The scheduler drops a dead worker when it sees its connection close (not waited for when an
            # engine failed its load: the next attempt leaves that receiver out).
            for _ in range(0 if broke else 10):
                info = await w.worker.scheduler.identity(n_workers=-1)
                left = [r for r in alive if r not in info["workers"]]
                if left:
                    break
                await asyncio.sleep(0.5)
            if not (left or broke) or attempt == SYNC_ATTEMPTS:
                raise
            log.warning("sync attempt %d: %d receivers left the cluster and %d engines failed their load during it "
                        "(%s; %s: %s); syncing again to the %d left", attempt, len(left), len(broke),
                        ", ".join(left + broke), type(e).__name__, e, len(alive) - len(left) - len(broke))


async def _states(worker, addresses) -> dict[str, dict]:
    """Each reachable receiver's endpoint state; one that cannot answer is left out."""
    import asyncio

    states = await asyncio.gather(*(asyncio.wait_for(worker.rpc(a).rose_weights_state(), 5.0) for a in addresses),
                                  return_exceptions=True)
    return {a: s for a, s in zip(addresses, states) if isinstance(s, dict)}


async def catch_up(_prepared, receivers: tuple[str, ...]) -> dict:
    """Task (on the trainer): bring workers that joined mid-run to the trainer's current version."""
    from rose.runtime.weights.sync import sync_to
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    return await sync_to(w.worker, w.weights, list(receivers))


def save_checkpoint(path: str, version: int) -> dict:
    """Task (on the trainer, between two train steps): write the trainer's state at `version` into the
    new directory `path`, atomically: written beside it, then renamed, so `path` is whole or absent."""
    import os
    import shutil
    import time

    from rose.runtime.worker.plugin import rose_worker
    from rose.runtime.worker.trainer import TrainerHost

    w = rose_worker()
    if not isinstance(w.host, TrainerHost) or w.host.trainer is None:
        raise RuntimeError(f"worker {w.address} (role {w.role}) holds no trainer; was it prepared?")
    trainer = w.host.trainer
    if trainer.version != version:
        raise RuntimeError(f"checkpoint of weight version {version} asked for, the trainer holds {trainer.version}")
    t0 = time.perf_counter()
    tmp = f"{path}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    from rose.runtime.worker import trainer_group as group

    # A sharded trainer's checkpoint is gathered from every rank; rank 0 (here) writes it.
    peers = group.submit_to_peers(w.host.peers, group.peer_save, tmp) if w.host.peers else []
    with group.peer_errors(peers, w.host.peers):
        trainer.save(tmp)
    group.wait_for_peers(peers)
    os.replace(tmp, path)
    return {"path": path, "version": version, "seconds": time.perf_counter() - t0}
