"""`rose sim`'s output: a table per setup, plots, and the matrix's headline figures."""
from __future__ import annotations

import json
import os

import numpy as np

from rose.sim.compare import Comparison, mean_rollout

COLUMNS = ("policy", "split", "traj/s", "x fixed", "rollout s", "train s", "sync s", "demand", "SLO miss",
           "sheds", "moved", "alloc", "GPU-h job", "GPU-h extra")


def table(c: Comparison) -> str:
    fixed = c.fixed or float("nan")
    lines = [f"== {c.config.name}: {c.config.model} on {c.config.job_gpus} job GPUs + {c.config.serving_gpus} serving "
             f"GPUs, {c.config.prompts} prompts x {c.config.group_size}, {c.config.algorithm}, trace "
             f"{c.config.trace}, links {c.config.intra_gbit:g}/{c.config.inter_gbit:g} Gbit/s",
             "  ".join(f"{h:>11}" for h in COLUMNS)]
    for p, r in c.results.items():
        extra = r.gpu_hours.get("elastic", 0.0) + r.gpu_hours.get("serving_borrowed", 0.0)
        miss = f"{r.slo_violations}/{r.slo_windows}" if r.slo_windows else "-"
        cells = (p, f"{c.splits[p]:g}", f"{r.throughput:.2f}", f"{r.throughput / fixed:.2f}",
                 f"{mean_rollout(r):.1f}", f"{np.mean(r.train_s):.1f}", f"{max(r.sync_s, default=0):.2f}",
                 f"{max(r.demand) / max(1, min(r.demand)):.2f}x" if r.demand else "-", miss, str(r.sheds),
                 str(r.migrations), f"{r.allocation_overhead:.4f}", f"{r.gpu_hours['job']:.1f}", f"{extra:.1f}")
        lines.append("  ".join(f"{x:>11}" for x in cells))
    row = c.row()
    lines.append(f"speed-up over fixed {row['speedup_vs_fixed']}, elastic/rose rollout "
                 f"{row['rollout_time_elastic_over_rose']}, fraction of ideal {row['fraction_of_ideal']}")
    return "\n".join(lines)


def headline(comps: list[Comparison]) -> dict:
    rows = [c.row() for c in comps]

    def vals(key):
        return [r[key] for r in rows if r[key] is not None]

    def lo(key):
        v = vals(key)
        return round(min(v), 3) if v else None

    def hi(key, digits=3):
        v = vals(key)
        return round(max(v), digits) if v else None
    return {"configs": len(comps), "speedup_vs_fixed_min": lo("speedup_vs_fixed"),
            "speedup_vs_fixed_max": hi("speedup_vs_fixed"),
            "rollout_time_elastic_over_rose_min": lo("rollout_time_elastic_over_rose"),
            "rollout_time_elastic_over_rose_max": hi("rollout_time_elastic_over_rose"),
            "fraction_of_ideal_min": lo("fraction_of_ideal"),
            "slo_violations": sum(vals("slo_violations")),
            "allocation_overhead_max": hi("allocation_overhead_rose", 6),
            "allocation_overhead_elastic_min": lo("allocation_overhead_elastic"),
            "allocation_overhead_elastic_max": hi("allocation_overhead_elastic")}


def write(comps: list[Comparison], out: str) -> list[str]:
    """Rows as JSON lines, and the four plots; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "results.jsonl")]
    with open(paths[0], "w") as f:
        for c in comps:
            f.write(json.dumps({**c.row(), "policies": {p: r.summary() for p, r in c.results.items()}}) + "\n")
    policies = list(dict.fromkeys(p for c in comps for p in c.results))
    # 1. throughput against scale (job + serving GPUs), per policy
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in policies:
        pts = sorted((c.config.job_gpus + c.config.serving_gpus, c.results[p].throughput / (c.fixed or 1))
                     for c in comps if p in c.results)
        ax.plot([x for x, _ in pts], [y for _, y in pts], "o", label=p, alpha=0.7)
    ax.set(xscale="log", xlabel="GPUs (job + serving)", ylabel="throughput / best fixed", title="Throughput by scale")
    ax.legend()
    paths.append(_save(fig, out, "throughput_vs_scale.png"))
    # 2. rollout time distributions
    fig, ax = plt.subplots(figsize=(7, 4.5))
    data = [[x for c in comps if p in c.results for x in c.results[p].rollout_s[1:]] for p in policies]
    ax.boxplot([d or [0.0] for d in data], tick_labels=policies)
    ax.set(ylabel="rollout phase per step (s)", yscale="log", title="Rollout time")
    paths.append(_save(fig, out, "rollout_time.png"))
    # 3. SLO attainment over time (rose): share of serving instances within their SLO each load tick
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in comps[:12]:
        r = c.results.get("rose")
        if r and r.attainment:
            ax.plot([t / 3600 for t, _ in r.attainment], [a for _, a in r.attainment], lw=0.8, label=c.config.name)
    ax.set(xlabel="hours", ylabel="serving instances within SLO", ylim=(0, 1.05), title="Serving SLO (rose)")
    paths.append(_save(fig, out, "slo_attainment.png"))
    # 4. GPU-hours per policy (job GPUs, plus on-demand or borrowed ones) per trained trajectory
    fig, ax = plt.subplots(figsize=(7, 4.5))
    job = [np.mean([c.results[p].gpu_hours["job"] / max(1, c.results[p].trained_trajectories) * 1e3
                    for c in comps if p in c.results]) for p in policies]
    extra = [np.mean([(c.results[p].gpu_hours["elastic"] + c.results[p].gpu_hours["serving_borrowed"])
                      / max(1, c.results[p].trained_trajectories) * 1e3 for c in comps if p in c.results])
             for p in policies]
    ax.bar(policies, job, label="job GPUs")
    ax.bar(policies, extra, bottom=job, label="on-demand / borrowed")
    ax.set(ylabel="GPU-hours per 1,000 trajectories (mean over configs)", title="GPU-hours used")
    ax.legend()
    paths.append(_save(fig, out, "gpu_hours.png"))
    return paths


def _save(fig, out: str, name: str) -> str:
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path
