"""Several trainer workers as one sharded trainer (rose/runtime/sharding.py): rank 0 drives its peers.

Rank 0 is the run's trainer as far as the rest of ROSE is concerned (the driver's train, sync and
checkpoint tasks go to it alone). Its peers are the cluster's other trainer workers, named in the run's
`ModelSpec.trainer_peers`. Every collective step of rank 0 (forming the process group, building and
restoring the trainer, a train step, publishing a version, a checkpoint) sends each peer a task
that makes the same collective calls, through the Dask client of rank 0's worker; rank 0 waits for
their results, so a peer's error surfaces in rank 0's task.

No launcher: the process group is bootstrapped through Dask. Rank 0 picks a free port on its own host
and the address travels to the peers inside their task's arguments (through the scheduler). gloo on CPU
hosts, nccl where the trainers have CUDA devices. A peer that dies closes its connections and the
collective under way fails at once; rank 0's task then names the peers that left (`peer_errors`). A
peer that hangs is waited for at most `GROUP_TIMEOUT_S`. A lost peer is not rejoined mid-run: the driver
sees the failed step as a lost trainer worker and rebuilds the trainer, on the trainer workers still
connected, from the last checkpoint (`rose.fleet.TrainerLost`).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import socket
from urllib.parse import urlparse

# A collective waiting this long on a rank fails its task (s; ROSE_TRAINER_GROUP_TIMEOUT_S overrides it).
GROUP_TIMEOUT_S = float(os.environ.get("ROSE_TRAINER_GROUP_TIMEOUT_S", "120"))


def free_init_method(worker_address: str) -> str:
    """tcp://HOST:PORT for the process group's rendezvous, on rank 0's own host, at a port free now."""
    host = urlparse(worker_address).hostname or "127.0.0.1"
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def form_group(rank: int, world: int, init_method: str) -> None:
    """Join the trainers' process group (leaving the previous run's, if any). Blocks until all ranks join."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        # A GPU each: a worker that sees one (CUDA_VISIBLE_DEVICES, as dask-cuda sets it) takes it; ranks
        # that share a host's GPUs take them by rank. (Untested here: no GPU.)
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))


def leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def submit_to_peers(peers: tuple[str, ...], fn, *args) -> list:
    """Futures of `fn(rank, *args)` on each peer (ranks 1..), submitted from this worker's client."""
    from distributed import get_client

    client = get_client()
    return [client.submit(fn, rank, *args, workers=[peer], allow_other_workers=False, pure=False)
            for rank, peer in enumerate(peers, start=1)]


def wait_for_peers(futures: list) -> list:
    """The peers' results; the first error of one raised here, naming it."""
    if not futures:
        return []
    from distributed import wait

    wait(futures, timeout=GROUP_TIMEOUT_S)  # results of peers whose collectives all succeeded: quick
    for f in futures:
        if f.status == "error":
            raise RuntimeError(f"trainer peer task {f.key} failed: {f.exception()!r}")
    return [f.result() for f in futures]


@contextlib.contextmanager
def peer_errors(futures: list, peers: tuple[str, ...] = ()):
    """Around rank 0's side of a collective: when it fails, say why in the peers' terms: a peer's own
    error if its task failed, or which peers left the cluster (a collective with a dead rank fails at
    once: its connections close)."""
    try:
        yield
    except Exception as e:
        failed = [f for f in futures if f.status == "error"]
        if failed:
            raise RuntimeError(f"trainer peer task {failed[0].key} failed: {failed[0].exception()!r}") from e
        gone = _departed(peers)
        if gone:
            raise RuntimeError(f"trainer peer(s) {', '.join(gone)} left the cluster during a collective step of "
                               f"the sharded trainer ({type(e).__name__}: {e}); a lost peer is not rejoined: "
                               f"the trainer is rebuilt on the ranks left, from the last checkpoint") from e
        raise


def _departed(peers: tuple[str, ...], wait_s: float = 5.0) -> list[str]:
    """The peers no longer connected to the scheduler (waiting up to `wait_s` for it to notice)."""
    import time

    from distributed import get_client

    if not peers:
        return []
    deadline = time.monotonic() + wait_s
    while True:
        alive = get_client().scheduler_info(n_workers=-1)["workers"]
        gone = [p for p in peers if p not in alive]
        if gone or time.monotonic() > deadline:
            return gone
        time.sleep(0.25)


def _host():
    """This worker's TrainerHost (found through the worker's plugins: the plugin module imports this one)."""
    from distributed import get_worker

    from rose.runtime.protocol import PLUGIN_NAME

    worker = get_worker()
    host = getattr(worker.plugins.get(PLUGIN_NAME), "host", None)
    if host is None or not hasattr(host, "build_trainer"):
        raise RuntimeError(f"worker {worker.address} is not a ROSE trainer worker")
    return host


def peer_prepare(rank: int, spec, world: int, init_method: str) -> dict:
    """Task on a peer: join the group and build this rank's shard of the run's trainer."""
    host = _host()
    form_group(rank, world, init_method)
    host.build_trainer(spec)
    host.publish()  # its part of the version the run starts from
    return {"rank": rank, "address": host.address}


def peer_train(rank: int, table, cfg) -> dict:
    """Task on a peer: this rank's part of one train step (and of publishing the new version)."""
    host = _host()
    trainer = host.trainer
    before = trainer.version
    trainer.step(table, cfg)
    if trainer.version != before:
        host.publish()  # its part of the new version
    return {"rank": rank, "version": trainer.version}


def peer_save(rank: int, path: str) -> dict:
    """Task on a peer: this rank's part of a checkpoint (rank 0 gathers and writes it)."""
    _host().trainer.save(path)
    return {"rank": rank}
