"""`LocalRoseCluster`: a real Dask scheduler and role-carrying worker processes on this host.

The same roles as a real cluster (`dask worker --preload rose.worker --rose-role ...`), so code that
runs here runs on dask-kubernetes or dask-jobqueue clusters unchanged. Each worker is bound to its
own cores: several vLLM engines (and the trainer) on a few cores otherwise starve each other.

With `security=distributed.Security(...)` carrying TLS certificates, every process (scheduler,
nannies, workers, and a Client made from the cluster) speaks `tls://`; ROSE's own traffic (weight
sync's worker-to-worker rpc, the placement plugin's reports) rides the same comms, so it is encrypted
too. The serving role's OpenAI-compatible HTTP endpoint is not a Dask comm and stays plain HTTP.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time

from distributed import Nanny, Scheduler, Security, SpecCluster
from distributed.core import Status
from distributed.deploy.cluster import Cluster
from tornado.ioloop import PeriodicCallback

from rose.config import ClusterConfig, EngineConfig
from rose.errors import ConfigError
from rose.runtime.engine.vllm_engine import cpu_kvcache_space_gib
from rose.runtime.placement.elastic import elastic_target
from rose.runtime.protocol import WORKER_LOG_ENV

logger = logging.getLogger("rose.cluster")
ELASTIC_PREFIX = "elastic-"


def _host_cores(cfg: ClusterConfig) -> list[int]:
    return list(cfg.cores) if cfg.cores else sorted(os.sched_getaffinity(0))


def _rollout_core(cfg: ClusterConfig, i: int) -> tuple[int, ...]:
    """The core of the i-th rollout worker (dedicated ones first, then serving, then on-demand ones):
    round-robin over the host's cores from the first; the trainer's are by default the others (the
    last where none is left), so a rollout worker shares a trainer core only when every other core has
    one (in synchronous mode the trainer idles while rollouts run)."""
    cores = _host_cores(cfg)
    return (cores[i % len(cores)],)


def _core_plan(cfg: ClusterConfig) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The cores of each trainer rank, and one core tuple per rollout worker.

    By default the trainer takes every core of the host that no rollout worker is bound to (nor an
    on-demand one the elastic policy may add), and the last core where none is left: on a laptop with
    more cores than rollout workers, the rest would otherwise idle while the trainer, one thread on one
    core, takes most of a synchronous step. Several ranks split the trainer's cores between them."""
    rollout = [_rollout_core(cfg, i) for i in range(cfg.num_dedicated + cfg.num_serving)]
    if cfg.trainer_cores:
        trainer = tuple(cfg.trainer_cores)
    else:
        host = _host_cores(cfg)
        extra = cfg.elastic.max_extra if cfg.policy == "elastic" else 0
        taken = {c for i in range(len(rollout) + extra) for c in _rollout_core(cfg, i)}
        trainer = tuple(c for c in host if c not in taken) or (host[-1],)
    n = cfg.num_trainers
    ranks = [trainer[r::n] or (trainer[r % len(trainer)],) for r in range(n)]
    return ranks, rollout


def synchronous_cores(cfg: ClusterConfig) -> ClusterConfig:
    """`cfg` for a synchronous run (rollouts, then training, never both): unless `trainer_cores` is set,
    the trainer takes every core no serving worker is bound to. A dedicated worker on one of them
    yields to each train step (`--rose-colocated`), which in a synchronous run costs it nothing, and
    the trainer's step runs on all of them: with the default pipeline here, 40 steps took 110 s where
    they took 149 s with the trainer on its own core, the same rewards to the digit (RESULTS.md)."""
    if cfg.trainer_cores is not None:
        return cfg
    serving = {c for i in range(cfg.num_dedicated, cfg.num_dedicated + cfg.num_serving) for c in _rollout_core(cfg, i)}
    host = _host_cores(cfg)
    return dataclasses.replace(cfg, trainer_cores=tuple(c for c in host if c not in serving) or (host[-1],))


_TLS_FIELDS = ("tls_ca_file", "tls_client_cert", "tls_scheduler_cert", "tls_worker_cert")


def _comm_options(security: Security | None) -> dict:
    """Scheduler and nanny options for `security`: none for plain TCP, else the Security and `tls`.

    Certificates alone select TLS (as `dask scheduler --tls-ca-file ...` does): a user who wrote
    them out meant them to be used, whether or not they also set `require_encryption`."""
    if security is None:
        return {}
    if not isinstance(security, Security):
        raise ConfigError(f"security must be a distributed.Security, got {type(security).__name__}")
    has_tls = any(getattr(security, f, None) for f in _TLS_FIELDS)
    if security.require_encryption and not has_tls:
        raise ConfigError("security requires encryption but carries no TLS certificates: set tls_ca_file and "
                          "the tls_{client,scheduler,worker}_{cert,key} files (or use Security.temporary())")
    return {"security": security, "protocol": "tls" if has_tls else "tcp"}


def _worker_spec(role: str, cores: tuple[int, ...], nthreads: int, engine: EngineConfig, name: str,
                 site: str, extra_argv: tuple[str, ...] = (), comm: dict | None = None,
                 log_dir: str | None = None) -> dict:
    env = {
        "OMP_NUM_THREADS": str(len(cores)),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(cpu_kvcache_space_gib(engine)),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if log_dir is not None:  # the worker writes its stdout and stderr there (rose.worker)
        env[WORKER_LOG_ENV] = os.path.join(log_dir, f"{name}.log")
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
            **(comm or {}),
        },
    }


class AllocatedNanny(Nanny):
    """A worker that first waits out a resource manager's allocation delay (the elastic baseline's
    on-demand workers: asking a cloud or batch system for a node is not instant)."""

    def __init__(self, *args, allocation_delay_s: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocation_delay_s = allocation_delay_s

    async def start_unsafe(self):
        await asyncio.sleep(self.allocation_delay_s)
        return await super().start_unsafe()


class LocalRoseCluster(SpecCluster):
    """Example:

        with rose.LocalRoseCluster(ClusterConfig(num_dedicated=1)) as cluster:
            report = rose.run(PIPELINE, cluster=cluster, steps=2)

    `security`: a `distributed.Security`; with TLS certificates in it the whole cluster runs over
    `tls://` (see the module docstring). None: plain TCP. `log_dir`: each worker writes its stdout and
    stderr (vLLM's and torch's messages) to `log_dir/NAME.log` instead of this process's console; its
    ROSE warnings still reach the driver (`rose.run` forwards them). None: the console.
    """

    def __init__(self, config: ClusterConfig = ClusterConfig(), engine: EngineConfig = EngineConfig(),
                 security: Security | None = None, log_dir: str | None = None, **kwargs):
        self.config = config
        self.engine_config = engine
        self.log_dir = log_dir
        # The same options for every process this cluster starts, now and later (elastic workers).
        self._comm = comm = _comm_options(security)
        rank_cores, dedicated_cores = _core_plan(config)
        workers = {}
        for i, cores in enumerate(rank_cores):  # more than one: the sharded trainer's ranks
            workers[f"trainer-{i}"] = _worker_spec("trainer", cores, 2, engine, f"trainer-{i}", config.trainer_site,
                                                   comm=comm, log_dir=log_dir)
        trainer_cores = tuple(c for cores in rank_cores for c in cores)
        slots = ("--rose-slots", str(config.dedicated_slots)) if config.dedicated_slots else ()
        self._trainer_cores = set(trainer_cores)
        for i, cores in enumerate(dedicated_cores[:config.num_dedicated]):
            name = f"dedicated-{i}"
            site = config.dedicated_sites[i] if config.dedicated_sites else config.trainer_site
            workers[name] = _worker_spec("dedicated", cores, engine.rollout_slots, engine, name, site,
                                         slots + self._colocated(cores), comm, log_dir)
        for i, cores in enumerate(dedicated_cores[config.num_dedicated:]):
            name = f"serving-{i}"
            argv = ("--rose-serving-model", config.serving_model, "--rose-ttft-ms", str(config.serving_ttft_ms),
                    "--rose-tpot-ms", str(config.serving_tpot_ms),
                    "--rose-rollout-seqs", str(config.serving_rollout_seqs))
            workers[name] = _worker_spec("serving", cores, engine.rollout_slots, engine, name, config.trainer_site,
                                         argv, comm, log_dir)
        for i in range(config.num_reward):
            workers[f"reward-{i}"] = _worker_spec("reward", trainer_cores, 4, engine, f"reward-{i}",
                                                  config.trainer_site, ("--rose-reward-model", config.reward_model),
                                                  comm, log_dir)
        scheduler = {"cls": Scheduler, "options": {
            # without the dashboard the scheduler still serves /health on HTTP: any free port, then
            "dashboard": config.dashboard, "dashboard_address": ":8787" if config.dashboard else ":0",
            "host": "127.0.0.1",
            # the placement plugin, as `dask scheduler --preload rose.plugin --rose-policy ...` installs it
            "preload": ["rose.plugin"], "preload_argv": ["--rose-policy", config.policy,
                                                            "--rose-shed-after", str(config.shed_after_s),
                                                            *(["--rose-migrate"] if config.migrate else [])],
            **comm,
        }}
        self._elastic_n = 0
        self.elastic_asked_at: list[float] = []  # time.monotonic() of each on-demand worker asked for
        self._elastic_warned = False  # the scaler says once that the scheduler gives no demand
        # SpecCluster's own rpc to the scheduler (and a Client made from this cluster) use `security` too.
        super().__init__(workers=workers, scheduler=scheduler, silence_logs=logging.WARNING, name="rose",
                         security=security, **kwargs)
        if config.policy == "elastic":
            # The elastic baseline's scaler: asks the placement plugin what waits, decides (pure), and
            # scales through SpecCluster.scale; new workers come from `new_worker_spec`.
            pc = PeriodicCallback(self._elastic_tick, 500)
            self.periodic_callbacks["rose-elastic"] = pc
            self.loop.add_callback(pc.start)

    def _update_worker_status(self, op, msg):
        """Follow the scheduler's worker list, without SpecCluster's closing of lost workers.

        SpecCluster closes the nanny of a worker the scheduler removed if, `distributed.deploy.lost-worker-timeout`
        (15 s) later, no worker of that name is connected: it looks at that instant only. A worker killed
        twice about 15 s apart was then caught between its second death and its replacement's start, and its
        nanny was closed for good: the run waited for a trainer that never came (chaos runs, 2026-12-06;
        reproduced on an idle cluster by killing the dedicated worker, then the trainer 2.5-4.5 s later, cycle
        after cycle: it came at 3.5 s, the fifth). Here every worker runs under a nanny that restarts it; nothing else should close one
        (scaling down still closes the workers it drops from the spec)."""
        if op == "remove":
            Cluster._update_worker_status(self, op, msg)
        else:
            super()._update_worker_status(op, msg)

    def _colocated(self, cores: tuple[int, ...]) -> tuple[str, ...]:
        """A dedicated worker on a trainer core shares the trainer's device: it takes no rollouts while
        a train step runs (the two take turns, as a colocated rollout engine and trainer do), unless
        `yield_to_trainer` is off (then the OS shares the core between them)."""
        shares = self._trainer_cores & set(cores)
        return ("--rose-colocated",) if shares and self.config.yield_to_trainer else ()

    def new_worker_spec(self) -> dict:
        cfg = self.config
        name = f"{ELASTIC_PREFIX}{self._elastic_n}"
        cores = _rollout_core(cfg, cfg.num_dedicated + cfg.num_serving + self._elastic_n)
        self._elastic_n += 1
        self.elastic_asked_at.append(time.monotonic())
        # The slots the scaler counted on when it asked (ElasticConfig.worker_slots), not the fixed
        # dedicated workers' own.
        slots = ("--rose-slots", str(cfg.elastic.worker_slots))
        spec = _worker_spec("dedicated", cores, self.engine_config.rollout_slots, self.engine_config, name,
                            cfg.trainer_site, (*slots, *self._colocated(cores), "--rose-elastic"), self._comm,
                            self.log_dir)
        spec["cls"] = AllocatedNanny
        spec["options"]["allocation_delay_s"] = cfg.elastic.allocation_delay_s
        return {name: spec}

    async def _elastic_tick(self) -> None:
        if self.status != Status.running:
            return
        try:
            demand = await self.scheduler_comm.rose_elastic_demand()
        except Exception as e:  # the scheduler is going away, or runs without rose.plugin
            if not self._elastic_warned:
                logger.warning("elastic scaler: no demand from the scheduler: %s", e)
                self._elastic_warned = True
            return
        self._elastic_warned = False
        up = {w.get("name") for w in self.scheduler_info.get("workers", {}).values()}
        elastic = [n for n in self.worker_spec if str(n).startswith(ELASTIC_PREFIX)]
        held = sum(n in up for n in elastic)
        target = elastic_target(demand["waiting_seqs"], held, len(elastic) - held, demand["idle_s"],
                                self.config.elastic)
        if target != len(elastic):
            logger.info("elastic scaler: %d on-demand workers -> %d (%d sequences waiting)", len(elastic), target,
                        demand["waiting_seqs"])
            self.scale(len(self.worker_spec) - len(elastic) + target)
