"""`rose` command line: `rose run PIPELINE.py [--steps N] [--seed S] [--out DIR] [--resume DIR]
[--algorithm grpo|dapo] [--track tensorboard|mlflow|wandb] [--trainers N] [--verbose] [--json]`, and
`rose serve-load URL [--trace FILE | --rate R --burst ...] [--duration S]`, and
`rose sim CONFIG.toml [--out DIR] [--json]` (the cluster simulator)."""
from __future__ import annotations

import json
import logging
import math
import os
import sys

import click

# Dask's scheduler and nannies log every start and stop at INFO; the per-step table is what a user of
# the command reads. Read by distributed when it is first imported, which happens after this line.
os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")

from rose.config import ALGORITHMS  # noqa: E402  (after the setting above: rose's imports may load distributed)
from rose.tracking import TRACKERS  # noqa: E402


@click.group()
def main():
    """ROSE: agentic RL post-training on Dask with borrowed serving capacity."""


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)


@main.command("run")
@click.argument("pipeline", type=click.Path(dir_okay=False))
@click.option("--steps", type=click.IntRange(min=1), default=None, help="RL steps (default: the pipeline's)")
@click.option("--seed", type=int, default=None, help="run seed (default: the pipeline's)")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="write metrics.csv, trajectories.parquet, summary.json and reward.png here "
                   "(default: runs/NAME)")
@click.option("--scheduler", default=None, help="address of a running Dask scheduler (default: a local cluster)")
@click.option("--staleness", type=click.IntRange(0, 1), default=None,
              help="0: synchronous steps; 1: the next step's rollouts run during this step's training "
                   "(default: the pipeline's)")
@click.option("--resume", type=click.Path(file_okay=False, exists=True), default=None,
              help="continue the run in this directory from its latest checkpoint (--out defaults to it; "
                   "--steps counts all steps, done ones too)")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=None,
              help="checkpoint every N steps and after the last (0: never; default: the pipeline's)")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default=None,
              help="the train nodes' algorithm (default: the pipeline's): dapo adds clip-higher, dynamic "
                   "sampling and token-level loss")
@click.option("--track", type=click.Choice(TRACKERS), multiple=True,
              help="also send each step's scalars and the run's settings here (repeatable; files under --out; "
                   "wandb offline unless WANDB_MODE=online)")
@click.option("--verbose", is_flag=True, help="show the local workers' vLLM and torch messages here (default: in "
                                               "OUT/logs/WORKER.log)")
@click.option("--trainers", type=click.IntRange(min=1), default=None,
              help="trainer workers of the local cluster, one model sharded over them (default: the pipeline's "
                   "ClusterConfig); with --scheduler, start that many `--rose-role trainer` workers instead")
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary line last")
def run_cmd(pipeline, steps, seed, out, scheduler, staleness, resume, checkpoint_every, algorithm, track, verbose,
            trainers, as_json):
    """Run a pipeline's RL steps and report per-step metrics."""
    import rose
    from rose.errors import RoseError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    cols = ["step", "reward_mean", "reward_std", "trajectories", "failed", "tokens", "rollout_s", "train_s",
            "sync_s", "step_s", "logprob_mismatch", "lost", "workers_lost"]
    if algorithm == "dapo":  # dynamic sampling: the groups rolled out and those that varied
        cols[4:4] = ["groups_sampled", "groups_varied"]
    widths = [max(len(c), 8) for c in cols]
    from tqdm.auto import tqdm

    def on_step(row):
        if row["step"] == 0:
            tqdm.write("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        tqdm.write("  ".join(_fmt(row[c]).rjust(w) for c, w in zip(cols, widths)))

    from rose.errors import RunError

    if trainers is not None and scheduler is not None:
        raise click.UsageError("--trainers sets up the local cluster; a cluster at --scheduler has the trainer "
                               "workers started on it (`dask worker ... --rose-role trainer`, one per rank)")
    try:
        p = rose.load_pipeline(pipeline)
        if trainers is not None:
            from dataclasses import replace

            p = replace(p, cluster=replace(p.cluster, num_trainers=trainers))
        out = out or resume or os.path.join("runs", p.name)
        report = rose.run(p, cluster=scheduler, steps=steps, seed=seed, on_step=on_step, staleness=staleness,
                          out=out, resume=resume, checkpoint_every=checkpoint_every, algorithm=algorithm,
                          track=list(track), verbose=verbose)
    except RunError as e:
        if e.report is not None and len(e.report.metrics):
            paths = e.report.save(out)
            click.echo(f"saved the {len(e.report.metrics)} finished steps: {', '.join(paths.values())}; "
                       f"`rose run {pipeline} --resume {out}` continues from the last checkpoint", err=True)
        raise click.ClickException(str(e)) from None
    except RoseError as e:
        raise click.ClickException(str(e)) from None
    summary = report.summary
    logs = "" if verbose or scheduler else f"; the workers' output to {os.path.join(out, 'logs')}"
    click.echo(f"wrote the report and checkpoints to {out}{logs}", err=True)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo("  ".join(f"{k}={v}" for k, v in summary.items()))
    sys.exit(0)


def _floats(value: str | None, n: int, name: str):
    if value is None:
        return None
    try:
        parts = tuple(float(x) for x in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) != n:
        raise click.BadParameter(f"{name} takes {n} comma-separated numbers, got {value!r}")
    return parts


@main.command("serve-load")
@click.argument("url")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False), default=None,
              help="replay a CSV in the Azure LLM inference trace format instead of synthetic arrivals")
@click.option("--time-scale", type=float, default=1.0, show_default=True, help="trace: multiply arrival gaps")
@click.option("--token-scale", type=float, default=1.0, show_default=True, help="trace: multiply token counts")
@click.option("--rate", type=float, default=2.0, show_default=True, help="synthetic: mean requests per second")
@click.option("--burst", default="20,4,3", show_default=True,
              help="synthetic: EVERY_S,LENGTH_S,FACTOR (rate x FACTOR for LENGTH_S every EVERY_S); 'none' for none")
@click.option("--diurnal", default=None, help="synthetic: PERIOD_S,AMPLITUDE of a sine swing of the rate")
@click.option("--prompt-tokens", default="16,48", show_default=True, help="MIN,MAX prompt tokens (trace: MAX)")
@click.option("--max-tokens", default="8,32", show_default=True, help="MIN,MAX generated tokens (trace: MAX)")
@click.option("--duration", type=float, default=60.0, show_default=True, help="seconds of traffic")
@click.option("--ttft-ms", type=float, default=1000.0, show_default=True, help="SLO: time to first token")
@click.option("--tpot-ms", type=float, default=100.0, show_default=True, help="SLO: time per output token")
@click.option("--seed", type=int, default=0)
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary line last")
def serve_load_cmd(url, trace, time_scale, token_scale, rate, burst, diurnal, prompt_tokens, max_tokens, duration,
                   ttft_ms, tpot_ms, seed, as_json):
    """Send serving traffic to URL (a ROSE serving worker or any OpenAI-compatible completions server)
    and measure TTFT, TPOT and SLO attainment on the client side."""
    import asyncio

    from rose.errors import ConfigError
    from rose.runtime.coserve import traffic

    lo_p, hi_p = (int(x) for x in _floats(prompt_tokens, 2, "--prompt-tokens"))
    lo_g, hi_g = (int(x) for x in _floats(max_tokens, 2, "--max-tokens"))
    try:
        if trace:
            arrivals = traffic.azure_trace(trace, time_scale, token_scale, hi_p, hi_g, duration)
        else:
            b = None if burst == "none" else traffic.Burst(*_floats(burst, 3, "--burst"))
            period, amp = _floats(diurnal, 2, "--diurnal") or (0.0, 0.0)
            arrivals = traffic.synthetic(rate, duration, (lo_p, hi_p), (lo_g, hi_g), b, period, amp, seed)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{len(arrivals)} requests over {duration:.0f} s to {url}", err=True)
    try:
        report = asyncio.run(traffic.play(url.rstrip("/"), arrivals, ttft_ms, tpot_ms, seed))
    except OSError as e:
        raise click.ClickException(f"cannot reach {url}: {e}") from None
    summary = report.summary()
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo("  ".join(f"{k}={v}" for k, v in summary.items()))


@main.command("sim")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="write results.jsonl and the plots here (default: runs/sim-NAME)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary line last")
def sim_cmd(config, out, as_json):
    """Simulate every setup CONFIG lists under each policy; print a table per setup and write plots."""
    from tqdm import tqdm

    from rose.errors import ConfigError
    from rose.sim import load_matrix
    from rose.sim.compare import compare
    from rose.sim.report import headline, table, write

    try:
        configs = load_matrix(config)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    runs = sum(len(c.policies) * max(1, len({c.train_fraction, *c.train_fractions})) for c in configs)
    comps = []
    with tqdm(total=runs, desc="simulating", unit="run", file=sys.stderr) as bar:
        for cfg in configs:
            comps.append(compare(cfg, progress=lambda *a: bar.update()))
            bar.write(table(comps[-1]) + "\n")
    out = out or os.path.join("runs", "sim-" + os.path.splitext(os.path.basename(config))[0])
    paths = write(comps, out)
    click.echo(f"wrote {', '.join(paths)}", err=True)
    summary = headline(comps)
    click.echo(json.dumps(summary) if as_json else "  ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
