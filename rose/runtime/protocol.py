"""The vocabulary the scheduler wing and the worker wing share, and the only module both import.

A worker announces itself with a `WorkerReport` (first in `Worker.metrics`, which registration carries,
then with `Worker.log_event(TOPIC, report.to_msg())` on every change); the scheduler's placement
plugin reads it back with `WorkerReport.from_msg`. Rollout tasks reach the plugin through their Dask
annotations (`Annotation`) or, without annotations, their key prefix. The driver sends each worker a
`ModelSpec` once per run.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from rose.config import EngineConfig

PLUGIN_NAME = "rose"  # name of the scheduler plugin and of the worker plugin
TOPIC = "rose-capacity"  # Worker.log_event topic of worker reports
YIELDED_OP = "rose-yielded"  # worker -> scheduler stream message: a shed rollout task running there holds no slots
ROLES = ("trainer", "dedicated", "serving", "reward")  # what `--rose-role` accepts
ROLLOUT_ROLES = ("dedicated", "serving")  # roles whose workers run rollouts
DEFAULT_SITE = "default"  # network site of a worker started without --rose-site
# A file a worker process writes its stdout and stderr to (set by LocalRoseCluster's `log_dir`)
WORKER_LOG_ENV = "ROSE_WORKER_LOG"
ROLLOUT_KEY_PREFIX = "rose-rollout-"  # a task with this key prefix is a rollout task, annotated or not


class Annotation:
    """Dask annotation keys the placement plugin reads (`dask.annotate(**{Annotation.ROLE: ...})`)."""

    ROLE = "rose-role"  # "rollout" marks a rollout task; "trainer" a trainer task
    WIDTH = "rose-width"  # trajectories a rollout task runs at once (sequences it takes on a worker)
    VERSION = "weight_version"  # the weight version a rollout task's engine must hold
    GROUP = "rose-group"  # fairness unit of rollout tasks ("graph/step")
    AFFINITY = "rose-affinity"  # worker that holds a continuation's prefixes in cache
    TRAINS = "rose-trains"  # a training task: colocated rollout workers yield while it runs


def is_rollout_task(key, annotations: dict) -> bool:
    """Whether the plugin manages task `key` (its annotations as `update_graph` gives them per key)."""
    return annotations.get(Annotation.ROLE) == "rollout" or (isinstance(key, str) and key.startswith(ROLLOUT_KEY_PREFIX))


def resume_key(key: str, attempt: int) -> str:
    """The key of a rollout group's `attempt`-th continuation (`key`: the group's first task)."""
    return f"{key}-resume{attempt}"


def group_of(key: str) -> str:
    """The key of the first task of the rollout group a task (or continuation, `resume_key`) runs."""
    return key.rsplit("-resume", 1)[0]


def rollout_addresses(by_role: dict[str, list[str]]) -> list[str]:
    """The rollout workers among workers grouped by role."""
    return sorted(a for r in ROLLOUT_ROLES for a in by_role.get(r, []))


@dataclass(frozen=True)
class ModelSpec:
    """What a worker needs to build its engine or trainer; sent by the driver once per run."""

    model_dir: str  # Hugging Face directory readable on the worker
    max_model_len: int  # tokens of context
    engine: EngineConfig
    seed: int = 0  # run seed: sampling seeds and the trainer's derive from it
    # Where the run's weights start: None, `model_dir`'s own; else a checkpoint directory of the run
    # (`rose.checkpoint`: a model directory of the same architecture, plus the trainer's state).
    weights_dir: str | None = None
    version: int = 0  # the weight version those weights are (0: the model's; k: after k train steps)
    # The trainer's other ranks (worker addresses, rank order): the trainer worker the run prepares is rank
    # 0 of a trainer sharded over them (rose/runtime/worker/trainer_group.py). Empty: one trainer.
    trainer_peers: tuple[str, ...] = ()

    @property
    def weights_from(self) -> str:
        return self.weights_dir or self.model_dir


@dataclass(frozen=True)
class WorkerReport:
    """What a ROSE worker tells the scheduler about itself. Plain data; `to_msg` gives the dict that
    travels (msgpack), `from_msg` reads one back and ignores keys it does not know (a newer worker)."""

    worker: str | None  # its address (None before it has one)
    role: str  # one of ROLES; the scheduler refuses others with a message
    site: str = DEFAULT_SITE  # network site: weight sync sends each shard into a site once
    slots: int = 0  # rollout sequences it can run at once now (0 on the trainer)
    weight_version: int = -1  # version its rollout engine holds (the trainer: last published); -1 unprepared
    model: str | None = None  # model directory of the run it is prepared for
    elastic: bool = False  # started on demand by the elastic baseline's scaler
    colocated: bool = False  # a dedicated worker sharing the trainer's device: no slots while it trains
    # Serving workers only:
    http_port: int | None = None  # port of its OpenAI-compatible endpoint
    slo_met: int | None = None  # serving requests completed inside the SLO, cumulative
    slo_requests: int | None = None  # serving requests completed, cumulative

    @property
    def is_rollout(self) -> bool:
        return self.role in ROLLOUT_ROLES

    def to_msg(self) -> dict:
        return asdict(self)

    @classmethod
    def from_msg(cls, msg: dict) -> "WorkerReport":
        """Raises ValueError naming what is missing (a report without a role or a worker)."""
        if not isinstance(msg, dict) or "role" not in msg:
            raise ValueError(f"a worker report needs a 'role'; got {msg!r}")
        if "worker" not in msg:
            raise ValueError(f"a worker report needs a 'worker' (its address, or None); got {msg!r}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in msg.items() if k in known})
