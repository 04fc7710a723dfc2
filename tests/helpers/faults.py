"""Faults injected into a live worker with `client.run` (tests and benchmarks/chaos.py): shard replies
corrupted in transit, a receiver whose pulls never answer, a weight load that fails inside vLLM."""
import asyncio
import threading

from rose.runtime.protocol import PLUGIN_NAME


def corrupt_next_replies(how: str = "flip", n: int = 1, dask_worker=None):
    """The next `n` shard replies this worker serves arrive bad: one byte flipped, or cut short."""
    ep = dask_worker.plugins[PLUGIN_NAME].weights
    serve, left = ep._serve, [n]
    lock = threading.Lock()  # replies to two receivers may be served at once, in two threads: n in all, not n each

    def corrupted(items):
        out = serve(items)
        with lock:
            return _spoil(out)

    def _spoil(out):
        for reply in out:
            if reply is not None and left[0] > 0:
                key = "dense" if "dense" in reply else "values"
                b = bytearray(reply[key])
                if how == "flip":
                    b[len(b) // 2] ^= 0x10
                else:
                    del b[len(b) // 2:]
                reply[key] = bytes(b)
                left[0] -= 1
                if left[0] == 0:
                    ep.__dict__.pop("_serve", None)
        return out

    ep._serve = corrupted
    return True


def restore_replies(dask_worker):
    dask_worker.plugins[PLUGIN_NAME].weights.__dict__.pop("_serve", None)
    return True


def stall_pulls(dask_worker):
    """This worker's shard pulls never answer: a sync waits on it (until it is killed)."""
    async def stalled(hops, manifest):
        await asyncio.sleep(3600)

    dask_worker.handlers["rose_weights_pull"] = stalled
    return True


def fail_next_load(from_version: int = 1, dask_worker=None):
    """The next load of a synced version (`from_version` or later) into this worker's vLLM rollout engine
    (a dedicated worker's, or a serving worker's second engine) fails inside vLLM, part way: one tensor in
    the middle of the load has the wrong shape."""
    host = dask_worker.plugins[PLUGIN_NAME].host
    engine = host.executor.rollout if hasattr(host, "executor") else host.engine.engine  # the VllmEngine
    for method in ("load_weights", "stage_weights"):  # whole, or in slices (a serving worker's)
        _spoil_next(engine, method, from_version)
    return True


def _spoil_next(engine, method: str, from_version: int) -> None:
    real = getattr(engine, method)

    def spoilt(named, version):
        if version < from_version:
            return real(named, version)
        for m in ("load_weights", "stage_weights"):  # once
            engine.__dict__.pop(m, None)
        named = dict(named)
        name = sorted(named)[len(named) // 2]
        named[name] = named[name].reshape(-1)[1:]
        return real(named, version)

    setattr(engine, method, spoilt)


def die_on_prepare(dask_worker):
    """This worker's process dies, with no goodbye, when a run next asks it to build its engine (as a crash
    inside the engine's build would: an illegal instruction, the OOM killer)."""
    import os

    plugin = dask_worker.plugins[PLUGIN_NAME]
    plugin.prepare = lambda spec: os._exit(1)
    return True
