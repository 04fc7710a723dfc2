"""`rose` command line: `rose run PIPELINE.py [--steps N] [--seed S] [--out DIR] [--json]`."""
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
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary line last")
def run_cmd(pipeline, steps, seed, out, scheduler, as_json):
    """Run a pipeline's RL steps and report per-step metrics."""
    import rose
    from rose.errors import RoseError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    cols = ["step", "reward_mean", "reward_std", "trajectories", "failed", "tokens", "rollout_s", "train_s",
            "sync_s", "logprob_mismatch"]
    widths = [max(len(c), 8) for c in cols]
    from tqdm.auto import tqdm

    def on_step(row):
        if row["step"] == 0:
            tqdm.write("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        tqdm.write("  ".join(_fmt(row[c]).rjust(w) for c, w in zip(cols, widths)))

    from rose.errors import RunError

    try:
        p = rose.load_pipeline(pipeline)
        report = rose.run(p, cluster=scheduler, steps=steps, seed=seed, on_step=on_step)
    except RunError as e:
        if e.report is not None and len(e.report.metrics):
            paths = e.report.save(out or os.path.join("runs", p.name))
            click.echo(f"saved the {len(e.report.metrics)} finished steps: {', '.join(paths.values())}", err=True)
        raise click.ClickException(str(e)) from None
    except RoseError as e:
        raise click.ClickException(str(e)) from None
    out = out or os.path.join("runs", p.name)
    paths = report.save(out)
    summary = report.summary
    click.echo(f"wrote {', '.join(paths.values())}", err=True)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo("  ".join(f"{k}={v}" for k, v in summary.items()))
    sys.exit(0)


if __name__ == "__main__":
    main()
