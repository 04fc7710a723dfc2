"""`LocalRoseCluster`: a real Dask scheduler and role-carrying worker processes on this host.

The same roles as a real cluster (`dask worker --preload rose.worker --rose-role ...`), so code that
runs here runs on dask-kubernetes or dask-jobqueue clusters unchanged. Each worker is bound to its
own cores: several vLLM engines (and the trainer) on a few cores otherwise starve each other.
"""
from __future__ import annotations

import logging
import os

from distributed import Nanny, Scheduler, SpecCluster

from rose.config import ClusterConfig, EngineConfig


def _core_plan(cfg: ClusterConfig) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Trainer cores and one core tuple per rollout worker (dedicated ones first, then serving ones).

    The trainer takes the last core; rollout workers share the rest round-robin (on a one-core
    host everyone shares it).
    """
    cores = list(cfg.cores) if cfg.cores else sorted(os.sched_getaffinity(0))
    trainer = (cores[-1],)
    rest = cores[:-1] or cores
    return trainer, [(rest[i % len(rest)],) for i in range(cfg.num_dedicated + cfg.num_serving)]


def _worker_spec(role: str, cores: tuple[int, ...], nthreads: int, engine: EngineConfig, name: str,
                 site: str, extra_argv: tuple[str, ...] = ()) -> dict:
    env = {
        "OMP_NUM_THREADS": str(len(cores)),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(engine.kv_cache_gib))),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return {
        "cls": Nanny,
        "options": {
            "nthreads": nthreads,
            "name": name,
            "env": env,
            "preload": ["rose.worker"],
            "preload_argv": ["--rose-role", role, "--rose-cores", ",".join(map(str, cores)), "--rose-site", site,
                             *extra_argv],
            "silence_logs": logging.WARNING,
        },
    }


class LocalRoseCluster(SpecCluster):
    """Example:

        with rose.LocalRoseCluster(ClusterConfig(num_dedicated=1)) as cluster:
            report = rose.run(PIPELINE, cluster=cluster, steps=2)
    """

    def __init__(self, config: ClusterConfig = ClusterConfig(), engine: EngineConfig = EngineConfig(), **kwargs):
        self.config = config
        self.engine_config = engine
        trainer_cores, dedicated_cores = _core_plan(config)
        workers = {"trainer-0": _worker_spec("trainer", trainer_cores, 2, engine, "trainer-0", config.trainer_site)}
        for i, cores in enumerate(dedicated_cores[:config.num_dedicated]):
            name = f"dedicated-{i}"
            site = config.dedicated_sites[i] if config.dedicated_sites else config.trainer_site
            workers[name] = _worker_spec("dedicated", cores, engine.rollout_slots, engine, name, site)
        for i, cores in enumerate(dedicated_cores[config.num_dedicated:]):
            name = f"serving-{i}"
            argv = ("--rose-serving-model", config.serving_model, "--rose-ttft-ms", str(config.serving_ttft_ms),
                    "--rose-tpot-ms", str(config.serving_tpot_ms))
            workers[name] = _worker_spec("serving", cores, engine.rollout_slots, engine, name, config.trainer_site,
                                         argv)
        scheduler = {"cls": Scheduler, "options": {
            # without the dashboard the scheduler still serves /health on HTTP: any free port, then
            "dashboard": config.dashboard, "dashboard_address": ":8787" if config.dashboard else ":0",
            "host": "127.0.0.1",
            # the placement plugin, as `dask scheduler --preload rose.plugin --rose-policy ...` installs it
            "preload": ["rose.plugin"], "preload_argv": ["--rose-policy", config.policy],
        }}
        super().__init__(workers=workers, scheduler=scheduler, silence_logs=logging.WARNING, name="rose", **kwargs)
