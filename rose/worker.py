"""The preload of ROSE workers: `dask worker SCHED --preload rose.worker --rose-role {trainer,dedicated,serving,reward}
[--rose-site S]` (serving workers also take `--rose-serving-model DIR [--rose-http-port P]`; reward
workers `--rose-reward-model DIR`).

It reads these options and installs the `RoseWorker` plugin (`rose.runtime.worker.plugin`), which
does the work. The plugin's task entry points and the protocol's names (`rose.runtime.protocol`) are
re-exported for code that imports them from here.
"""
from __future__ import annotations

import logging
import os
import sys

import click

from rose.runtime.coserve.host import ServingConfig, serving_engine_settings
from rose.runtime.coserve.slo import RolloutCaps, SloConfig
from rose.runtime.protocol import DEFAULT_SITE, PLUGIN_NAME, ROLES, ROLLOUT_ROLES, WORKER_LOG_ENV, ModelSpec
from rose.runtime.worker.plugin import RoseWorker, prepare_worker, rose_worker, rose_worker_of

__all__ = ["ROLES", "ROLLOUT_ROLES", "ModelSpec", "RoseWorker", "dask_setup", "prepare_worker", "rose_worker",
           "rose_worker_of"]

logger = logging.getLogger("rose.worker")


def _log_to_file(path: str) -> None:
    """Send this process's stdout and stderr to `path` (appending), at the file descriptors: vLLM's,
    torch's and the C++ libraries' messages are written there, not through a Python logger."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


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
@click.option("--rose-learn-margin/--rose-fixed-margin", default=True, show_default=True,
              help="serving role: learn the share of the TPOT budget rollout leaves unused, or keep it at "
                   "SloConfig.margin (SloConfig.learn_margin)")
@click.option("--rose-rollout-seqs", type=int, default=64, show_default=True,
              help="serving role: at most this many rollout sequences in flight (the memory budget)")
@click.option("--rose-serving-engine", default=None, help="serving role: its engine, e.g. "
              "'dtype=bfloat16,max_num_seqs=64,gpu_memory_utilization=0.45,max_model_len=4096'")
@click.option("--rose-rollout-gpu-memory", type=float, default=None,
              help="serving role, GPU: the rollout engine's device memory fraction [default: the run's]")
@click.option("--rose-reward-model", default=None, help="reward role: a sequence-classification model directory")
@click.option("--rose-slots", type=click.IntRange(min=1), default=None,
              help="dedicated role: rollout sequences run at once [default: twice the engine's max_num_seqs]")
@click.option("--rose-elastic", is_flag=True, default=False,
              help="this worker was started on demand by the elastic baseline's scaler")
@click.option("--rose-colocated", is_flag=True, default=False,
              help="dedicated role: this worker shares its device with the trainer and takes no rollouts while "
                   "a train step runs (asynchronous runs overlap rollouts with training elsewhere)")
async def dask_setup(worker, rose_role, rose_cores, rose_site, rose_serving_model, rose_http_port, rose_http_host,
                     rose_ttft_ms, rose_tpot_ms, rose_learn_margin, rose_rollout_seqs, rose_serving_engine,
                     rose_rollout_gpu_memory, rose_reward_model, rose_slots, rose_elastic, rose_colocated):
    if os.environ.get(WORKER_LOG_ENV):  # before anything loads vLLM or a model
        _log_to_file(os.environ[WORKER_LOG_ENV])
    if rose_colocated and rose_role != "dedicated":
        raise click.BadParameter(f"is for --rose-role dedicated, not {rose_role!r}", param_hint="--rose-colocated")
    serving = None
    if rose_role == "serving":
        if not rose_serving_model:
            raise click.UsageError("--rose-role serving needs --rose-serving-model DIR")
        engine, max_len = serving_engine_settings(rose_serving_engine)
        serving = ServingConfig(rose_serving_model, rose_http_host, rose_http_port,
                                SloConfig(rose_ttft_ms, rose_tpot_ms, learn_margin=rose_learn_margin),
                                RolloutCaps(max_seqs=rose_rollout_seqs), engine, max_len, rose_rollout_gpu_memory)
    plugin = RoseWorker(role=rose_role, cores=_parse_cores(rose_cores), site=rose_site, elastic=rose_elastic,
                        max_slots=rose_slots, colocated=rose_colocated, serving=serving,
                        reward_model=rose_reward_model)
    if rose_role in ROLLOUT_ROLES and worker.state.nthreads < 16:
        logger.warning("rollout worker %s has %d threads: at most %d rollout tasks run on it at once; start it "
                       "with --nthreads 128", worker.address, worker.state.nthreads, worker.state.nthreads)
    # Errors in the plugin's setup (a serving model that does not load) stop the worker from starting.
    await worker.plugin_add(plugin, name=PLUGIN_NAME, catch_errors=False)
