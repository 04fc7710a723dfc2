"""The tweaks a ROSE worker makes to its own process when it starts: glibc malloc thresholds fit for
torch again, Dask's statistical profiler off, fewer garbage collections, the process bound to the
worker's cores."""
from __future__ import annotations

import gc
import logging
import os

logger = logging.getLogger("rose.worker")


def tune_process(worker, cores: tuple[int, ...] | None) -> None:
    """All of the tweaks, for `worker` bound to `cores` (None: leave the binding as is)."""
    undo_nanny_malloc_trim()
    stop_profiler(worker)
    tune_gc()
    if cores:
        bind_to_cores(cores)


# Objects allocated between two youngest-generation collections (Python's default: 700).
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Collect the youngest generation after GC_GEN0_THRESHOLD allocations instead of 700.

    A rollout worker allocates a few hundred objects per policy turn (the turn's ids, log-probs, the
    engine's outputs) and frees nearly all of them by reference counting; at the default threshold
    the collector ran about 75 young and 7 middle collections per round of 256 guess episodes, 0.03-0.05 s
    of a 0.7 s round on the engine's core; at 20,000, one young collection (about 0.01 s). Cycles are
    still collected, later. The same call serves the benchmark's direct-vLLM baseline."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def undo_nanny_malloc_trim() -> None:
    """Give glibc malloc back thresholds that suit torch; Dask's Nanny spawns workers with
    MALLOC_TRIM_THRESHOLD_=65536 (so idle workers return memory to the OS).

    Setting that variable also freezes glibc's mmap threshold at 128 KiB, so every tensor buffer
    above it is mmap'd and unmapped again: measured here, vLLM iterations and trainer steps ran
    about 2x slower inside a Dask worker than in a plain process. mallopt at run time restores
    sane values (the variable itself is read once, at process start, so it cannot be fixed later).
    """
    import ctypes
    import ctypes.util

    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
        libc.mallopt(m_trim_threshold, 128 * 1024 * 1024)
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    except (OSError, AttributeError) as e:  # not glibc
        logger.info("cannot tune malloc thresholds: %s", e)


def stop_profiler(worker) -> None:
    """Stop Dask's statistical profiler on `worker`.

    It samples every thread's stack every 10 ms holding the GIL; a rollout worker has a hundred
    waiting task threads and one busy engine thread (measured: rollout rounds ~25 % slower with it
    on). Stopped here, in the worker's own setup, so workers started by hand get this too.
    """
    for name in ("profile", "profile-cycle"):
        pc = worker.periodic_callbacks.pop(name, None)
        if pc is not None:
            pc.stop()


def bind_to_cores(cores: tuple[int, ...]) -> None:
    """Bind the whole process: its Python threads (rollout tasks, Dask comms) then stay off the cores
    of the other workers on this host, as its engine's kernels do.

    Linux binds one thread per call (pid 0 is the calling thread), and threads inherit their creator's
    cores. Threads started before the worker's setup (the nanny's watcher, the allocator's) would keep
    the cores of whatever started the process, so every thread there is now is bound too."""
    try:
        os.sched_setaffinity(0, set(cores))
    except (AttributeError, OSError) as e:
        logger.warning("cannot bind worker to cores %s: %s", cores, e)
        return
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            os.sched_setaffinity(int(tid), set(cores))
        except OSError:  # the thread has ended since
            pass
