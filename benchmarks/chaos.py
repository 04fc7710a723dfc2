"""Claim: a run survives what clusters do to it. Every planned step completes, no trajectory is lost or
duplicated (by the independent ledger), every corrupted shard is caught, serving keeps its SLO through
10x bursts, bad inputs never crash a server, and a resumed run gives the uninterrupted run's next step
bit for bit.

Phases, each on a real LocalRoseCluster (scheduler with rose.plugin, nanny workers, vLLM engines):
1. synchronous: the default pipeline's settings (guess; trainer + one dedicated + one serving worker,
   the dedicated worker held to fewer sequences than a step has, so rollouts overflow onto the serving
   worker; trainer and dedicated worker on core 0, the serving worker alone on core 1), under serving
   traffic with 10x bursts; faults by step: SIGKILL of the dedicated worker
   while it runs rollouts, of the trainer while it trains, of a receiver in the middle of a weight
   sync (its pulls stalled first, so the kill lands inside the sync), shards flipped and truncated
   in transit from the trainer, a weight load that fails inside the serving worker's rollout engine
   (it serves on, out of rollouts) and (full run) inside the dedicated worker's (it restarts itself).
   Nannies restart every killed worker.
2. asynchronous (staleness 1): SIGKILL of the serving worker while it runs rollouts (full run), of the
   dedicated worker, and of the trainer while it trains.
3. bad inputs: hypothesis-fuzzed pipeline graphs (only ROSE's own errors may come out), hostile HTTP
   against a serving worker (malformed and fuzzed bodies, a huge payload, slow clients; the server must
   answer a good request afterwards), and a pipeline whose environments raise, hang past
   `env_timeout_s` or open with prompts longer than the context, and whose rewards are NaN.
4. resume: 3 steps straight against 2 steps, then `resume=` for the third: the third step's learning
   metrics and trajectories must be identical (float32 engines, same seed).

Figures are counts measured in this run (nothing is a ratio against a baseline here: the baseline is
the fault-free expectation, steps_completed == steps_planned and zero lost).

    python benchmarks/chaos.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.helpers.chaos_faults import FaultInjector, hostile_http, serving_traffic  # noqa: E402

# step -> faults armed when that step starts. Kills need a worker's engine rebuilt (~30 s here).
# Checkpoints come every 2 steps (after odd steps): a trainer killed in step k redoes the steps after
# the last committed checkpoint (k-1 and k synchronous; further back asynchronous). A shard fault is
# consumed by the next sync (or catch-up) the trainer serves and counted by the receiver that catches
# it (`Report.shards_refetched`, redone steps included). So shard faults sit where no trainer kill
# can take an armed fault along, and not where a receiver is killed in that step's sync (or,
# asynchronous, in the next step, while that sync runs): a receiver that dies takes its count with it.
# A failed load takes its worker out of rollouts (a dedicated one restarts, its engine rebuilt; a serving
# one for the rest of the run): late in the run, so that the kills and shard faults still find receivers,
# and the dedicated one some steps after the last kill of that worker: a killed worker's replacement
# takes about 6 steps here to join, and the fault lands only on a worker with an engine.
SYNC_FAULTS_QUICK = {1: ["flip_shard"], 2: ["kill_dedicated@rollout"], 3: ["truncate_shard"],
                     5: ["kill_trainer@train"], 7: ["kill_receiver@sync"], 8: ["fail_load_serving"]}
ASYNC_FAULTS_QUICK: dict[int, list[str]] = {}
SYNC_FAULTS_FULL = {1: ["flip_shard"], 2: ["kill_dedicated@rollout"], 3: ["truncate_shard"],
                    5: ["kill_trainer@train"], 6: ["flip_shard"], 7: ["kill_receiver@sync"],
                    8: ["kill_dedicated@rollout"], 9: ["truncate_shard"], 11: ["kill_trainer@train"],
                    12: ["flip_shard"], 13: ["kill_receiver@sync"], 15: ["truncate_shard"], 17: ["flip_shard"],
                    21: ["fail_load_dedicated"], 23: ["fail_load_serving"]}
ASYNC_FAULTS_FULL = {1: ["kill_serving@rollout"], 2: ["flip_shard"], 4: ["kill_dedicated@rollout"],
                     5: ["truncate_shard"], 7: ["kill_trainer@train"], 8: ["flip_shard"],
                     10: ["kill_serving@rollout"], 11: ["truncate_shard"]}


def pipeline_for(steps: int, staleness: int, model_dir: str):
    from dataclasses import replace

    import rose
    from pipelines.guess import PIPELINE

    # As in elastic_e2e: the RL job owns core 0 (trainer and dedicated worker, which yields while the
    # trainer trains); the serving worker has core 1 to itself and lends what it can spare.
    cluster = rose.ClusterConfig(num_dedicated=1, num_serving=1, serving_model=model_dir, dedicated_slots=64,
                                 serving_rollout_seqs=64, serving_ttft_ms=1000.0, serving_tpot_ms=100.0,
                                 trainer_cores=(0,))
    return replace(PIPELINE, steps=steps, staleness=staleness, cluster=cluster, checkpoint_every=2)


def chaos_phase(name: str, steps: int, staleness: int, faults: dict, model_dir: str, args, load: bool) -> dict:
    from distributed import Client

    import rose
    from rose.errors import RunError
    from rose.runtime.cluster import LocalRoseCluster

    p = pipeline_for(steps, staleness, model_dir)
    out = {"phase": name, "steps_planned": steps}
    print(f"[{name}] {steps} steps, faults at steps {sorted(faults)}", file=sys.stderr, flush=True)
    with LocalRoseCluster(p.cluster, p.engine) as cluster, Client(cluster) as client, \
            tempfile.TemporaryDirectory(prefix="rose-chaos-") as run_dir:
        injector = FaultInjector(client, faults)
        traffic = serving_traffic(client, args, steps * 20.0) if load else None
        t0 = time.perf_counter()
        try:
            report = rose.run(p, cluster=client, progress=False, out=run_dir, on_step=injector.on_step)
            out["error"] = None
        except RunError as e:  # counted as steps not completed; the figures show it
            report, out["error"] = e.report, str(e)
            print(f"[{name}] {e}\n{cluster_processes()}", file=sys.stderr, flush=True)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        injector.stop()
        unsent = injector.corrupt_unsent()
        burst = traffic.finish() if traffic else None
    m = report.metrics
    out.update(steps_completed=len(m), trajectories_expected=steps * p.build(0).nodes["prompts"].params["num_groups"]
               * p.build(0).nodes["prompts"].params["group_size"],
               trajectories=report.trajectories.num_rows, lost=report.lost, duplicated=report.duplicated,
               failed=report.summary["failed"], workers_lost=report.workers_lost,
               trainer_restarts=report.trainer_restarts, faults_injected=len(injector.done),
               faults_missed=injector.missed, corrupt_injected=injector.corrupt_injected - unsent,
               corrupt_unsent=unsent,
               corrupt_detected=report.shards_refetched,
               refetches_by_step=[int(x) for x in m["sync_refetches"]] if len(m) else [],
               faults=injector.done, burst=burst)
    print(f"[{name}] {json.dumps({k: v for k, v in out.items() if k != 'faults'})}", file=sys.stderr, flush=True)
    return out


def cluster_processes() -> str:
    """This process (it runs the cluster's scheduler and nannies) and its descendants (the workers), each
    with its state, CPU and age, and its Python stacks where py-spy is installed: what a failed phase
    leaves to look at (two full runs on 2026-12-06 ended with restarted workers that never connected, and
    their logs said nothing)."""
    import shutil
    import subprocess

    rows = subprocess.run(["ps", "-eo", "pid,ppid,etimes,stat,pcpu,rss,args"], capture_output=True,
                          text=True).stdout.splitlines()
    children: dict[int, list[str]] = {}
    for row in rows[1:]:
        pid, ppid = (int(x) for x in row.split()[:2])
        children.setdefault(ppid, []).append(row)
    me = next(row for row in rows[1:] if int(row.split()[0]) == os.getpid())
    out, todo = [rows[0], me[:200]], [os.getpid()]  # this process too: it holds the nannies
    while todo:
        for row in children.get(todo.pop(), []):
            if row.split()[6:8] == ["ps", "-eo"]:  # this listing itself
                continue
            out.append(row[:200])
            todo.append(int(row.split()[0]))
    spy = shutil.which("py-spy")
    for row in out[1:] if spy else []:
        pid = row.split()[0]
        dump = subprocess.run([spy, "dump", "--nonblocking", "-p", pid], capture_output=True, text=True, timeout=30)
        out.append(f"--- py-spy dump -p {pid}\n{(dump.stdout or dump.stderr)[:4000]}")
    return "\n".join(out)


def bad_inputs_phase(model_dir: str, args) -> dict:
    """Fuzzed graphs (no cluster), then hostile HTTP and bad environments on one cluster."""
    from dataclasses import replace

    from distributed import Client

    import rose
    from tests.helpers.chaos_faults import fuzz_graphs
    from rose.graph import rl_step
    from rose.runtime.cluster import LocalRoseCluster

    graphs_tried, graph_crashes = fuzz_graphs(args.graphs)
    envs = ("tests.helpers.envs:BadInputsEnv", "tests.helpers.envs:NanRewardEnv")

    def build(step):
        return rl_step("chaos-bad", envs[step % 2], 4, 4)

    engine = rose.EngineConfig(dtype="float32", env_timeout_s=5.0)
    cluster_cfg = rose.ClusterConfig(num_dedicated=0, num_serving=1, serving_model=model_dir)
    p = rose.Pipeline(name="chaos-bad", env="guess", build=build, steps=2, engine=engine, cluster=cluster_cfg)
    with LocalRoseCluster(cluster_cfg, engine) as cluster, Client(cluster) as client:
        http_tried, http_ok_after = hostile_http(client, args.http)
        report = rose.run(replace(p), cluster=client, progress=False)
        http_tried2, http_ok_after2 = hostile_http(client, 0)
    t = report.trajectories
    failed = [e for e, r in zip(t["error"].to_pylist(), t["finish_reason"].to_pylist()) if r == "failed"]
    return {"phase": "bad_inputs", "graphs_tried": graphs_tried, "graph_crashes": graph_crashes,
            "http_tried": http_tried, "server_alive_after": http_ok_after and http_ok_after2,
            "env_trajectories": t.num_rows, "env_failed": len(failed), "env_failed_with_reason": sum(bool(e) for e in failed),
            "steps_completed": len(report.metrics), "steps_planned": 2, "lost": report.lost,
            "duplicated": report.duplicated}


def resume_phase() -> dict:
    from dataclasses import replace

    from distributed import Client

    import rose
    from pipelines.guess import PIPELINE
    from rose.runtime.cluster import LocalRoseCluster

    # Synchronous: a resumed asynchronous run starts its next step's rollouts on the checkpoint's weights,
    # where the uninterrupted run had started them on the weights before (rose.schedule.plan_run).
    p = replace(PIPELINE, steps=3, checkpoint_every=2, staleness=0, cluster=rose.ClusterConfig(num_dedicated=1))
    cols = ["step", "weight_version", "reward_mean", "reward_std", "tokens", "failed", "logprob_mismatch", "loss"]
    with LocalRoseCluster(p.cluster, p.engine) as cluster, Client(cluster) as client, \
            tempfile.TemporaryDirectory() as whole_dir, tempfile.TemporaryDirectory() as cut_dir:
        whole = rose.run(p, cluster=client, progress=False, out=whole_dir)
        rose.run(p, cluster=client, progress=False, out=cut_dir, steps=2)
        resumed = rose.run(p, cluster=client, progress=False, resume=cut_dir)
    same_metrics = resumed.metrics[cols].to_dict("records") == whole.metrics[cols].to_dict("records")
    key = ["trajectory_id", "token_ids", "logprobs", "reward"]
    same_rows = (resumed.trajectories.sort_by("trajectory_id").select(key).to_pylist()
                 == whole.trajectories.sort_by("trajectory_id").select(key).to_pylist())
    return {"phase": "resume", "resume_identical": bool(same_metrics and same_rows), "same_metrics": same_metrics,
            "same_trajectories": same_rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and faults (under ~6 minutes)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.graphs, args.http = (100, 40) if args.quick else (400, 200)
    args.ttft_ms, args.tpot_ms = 1000.0, 100.0

    from pipelines.guess import PIPELINE
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(PIPELINE.model, env_class(PIPELINE.env), progress=False)
    t0 = time.perf_counter()
    phases = [chaos_phase("sync", 9 if args.quick else 24, 0, SYNC_FAULTS_QUICK if args.quick else SYNC_FAULTS_FULL,
                          model_dir, args, load=True)]
    if not args.quick:
        phases.append(chaos_phase("async", 13, 1, ASYNC_FAULTS_FULL, model_dir, args, load=False))
    bad = bad_inputs_phase(model_dir, args)
    resume = resume_phase()
    chaos = [ph for ph in phases]

    print(f"\n{'phase':<8} {'steps':>11} {'faults':>6} {'missed':>6} {'traj':>6} {'lost':>4} {'dup':>4} "
          f"{'failed':>6} {'corrupt':>9} {'burst SLO':>9} {'seconds':>8}")
    for ph in chaos:
        burst = ph["burst"]["slo_attainment"] if ph["burst"] else float("nan")
        print(f"{ph['phase']:<8} {ph['steps_completed']:>5}/{ph['steps_planned']:<5} {ph['faults_injected']:>6} "
              f"{ph['faults_missed']:>6} {ph['trajectories']:>6} {ph['lost']:>4} {ph['duplicated']:>4} "
              f"{ph['failed']:>6} {ph['corrupt_detected']:>4}/{ph['corrupt_injected']:<4} {burst:>9.4f} "
              f"{ph['seconds']:>8}")
        for f in ph["faults"]:
            print(f"    step {f['step']:>2}: {f['kind']:<24} {f.get('detail', '')}")
    print(f"bad inputs: {bad}")
    print(f"resume: {resume}")
    bursts = [ph["burst"] for ph in chaos if ph["burst"]]
    summary = {
        "bench": "chaos", "quick": args.quick,
        "faults_injected": sum(ph["faults_injected"] for ph in chaos),
        "steps_planned": sum(ph["steps_planned"] for ph in chaos) + bad["steps_planned"],
        "steps_completed": sum(ph["steps_completed"] for ph in chaos) + bad["steps_completed"],
        "trajectories_expected": sum(ph["trajectories_expected"] for ph in chaos),
        "trajectories_lost": sum(ph["lost"] for ph in chaos) + bad["lost"],
        "trajectories_duplicated": sum(ph["duplicated"] for ph in chaos) + bad["duplicated"],
        "corrupt_injected": sum(ph["corrupt_injected"] for ph in chaos),
        "corrupt_detected": sum(ph["corrupt_detected"] for ph in chaos),
        "burst_slo_attainment": round(min(b["slo_attainment"] for b in bursts), 4) if bursts else None,
        "bad_inputs_tried": bad["graphs_tried"] + bad["http_tried"] + bad["env_trajectories"],
        "server_crashes": int(not bad["server_alive_after"]),
        "fuzzed_graph_unexpected_errors": bad["graph_crashes"],
        "resume_identical": resume["resume_identical"],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
