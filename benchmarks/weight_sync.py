"""Claim: ROSE's weight sync sends a small fraction of a full broadcast and finishes many times sooner
over a slow link, near what any lossless coding of the change needs (targets at lr 1e-6: bytes_ratio
>= 30, speedup >= 10, bytes_over_bound <= 1.15, receivers bit-exact).

Two sites joined by a rate-limited link: this benchmark makes a network namespace and a veth pair
(`tc` token bucket, --rate, default 1 Gbit/s) and starts a real Dask scheduler and workers as
processes: the trainer and half the receivers in site "a" (the root namespace), the other half in
site "b" (the namespace). After one warm-up step (not counted), after each real train step (GRPO on
random token sequences; AdamW at the given lr; fp32 master weights), the trainer publishes the step's
weights in bf16, then:
- full: every shard, dense, from the trainer to every receiver (the broadcast baseline), measured
  and then dropped by the receivers;
- rose: the sync plan (only changed shards, as deltas where smaller, each crossing the link once,
  relayed inside the site), committed.
Both go over the same Dask comm handlers; times are the transfer phase of each (hash checks
included, publishing and the final swap excluded from both). Receivers here are ROSE worker
endpoints without an engine (the swap into vLLM is covered by tests/integration/test_weight_sync.py).
Exact: every receiver's weights hash equal to the trainer's own parameters cast to bf16.
Device path: the trainer also publishes each version through the publisher's device path (what a CUDA
trainer runs: the previous version kept where the weights are, only changed elements copied out; forced
on here, where the weights are on the CPU): `device_copy_ratio` is the bytes it copies to the host over
the version's bytes, `device_path_exact` that its shards are exactly those published.
Bound: after each publish the trainer computes the entropy bound of the step's change
(`rose/runtime/weights/bound.py`: per changed shard, which elements changed at their density plus the
empirical entropy of the bit differences, or the dense shard where that is smaller), once per
receiver as `sent_bytes` counts it (each receiver is one version behind and gets each changed shard
once); `bytes_over_bound = sent_bytes / bound_bytes`.

    sudo python benchmarks/weight_sync.py [--quick]      # needs root for `ip netns` and `tc`
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NS = "rose-bench-b"
VETH = ("rosebench0", "rosebench1")
IP_A, IP_B = "10.78.0.1", "10.78.0.2"
DTYPE = "bfloat16"
DEFAULT_LR = 3e-4  # GRPOConfig().lr, the default pipeline's


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Link:
    """Site b's namespace and a veth pair to it, rate-limited both ways."""

    def __init__(self, rate: str):
        self.rate = rate

    def __enter__(self):
        self.__exit__()
        try:
            sh("ip", "netns", "add", NS)
            sh("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
            sh("ip", "link", "set", VETH[1], "netns", NS)
            sh("ip", "addr", "add", f"{IP_A}/24", "dev", VETH[0])
            sh("ip", "link", "set", VETH[0], "up")
            sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{IP_B}/24", "dev", VETH[1])
            sh("ip", "netns", "exec", NS, "ip", "link", "set", VETH[1], "up")
            sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
            for prefix, dev in (((), VETH[0]), (("ip", "netns", "exec", NS), VETH[1])):
                sh(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate, "burst", "256kb",
                   "latency", "100ms")
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            self.__exit__()
            err = getattr(e, "stderr", "") or str(e)
            raise SystemExit(f"cannot make the rate-limited link (needs root, iproute2 and tc): {err.strip()}")
        return self

    def __exit__(self, *exc):
        subprocess.run(["ip", "link", "del", VETH[0]], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)

    def describe(self) -> str:
        return f"veth between network namespaces, tc tbf {self.rate}"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Processes:
    """A scheduler, the trainer and receivers as real processes, in their sites."""

    def __init__(self, receivers: int):
        self.receivers = receivers
        self.procs: list[subprocess.Popen] = []
        self.address = f"tcp://{IP_A}:{_free_port(IP_A)}"

    def _start(self, args, netns=False):
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        cmd = (["ip", "netns", "exec", NS] if netns else []) + [dask, *args]
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "DASK_LOGGING__DISTRIBUTED": "error", "OMP_NUM_THREADS": "1"}
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))  # a group to kill, wrapper and all

    def __enter__(self):
        port = self.address.rsplit(":", 1)[1]
        self._start(["scheduler", "--host", IP_A, "--port", port, "--no-dashboard"])
        common = ["--nthreads", "1", "--no-nanny", "--memory-limit", "0", "--preload", "rose.worker"]
        self._start(["worker", self.address, "--host", IP_A, *common, "--rose-role", "trainer", "--rose-site", "a"])
        for i in range(self.receivers):
            site_b = i % 2 == 1
            self._start(["worker", self.address, "--host", IP_B if site_b else IP_A, *common,
                         "--rose-role", "dedicated", "--rose-site", "b" if site_b else "a"], netns=site_b)
        return self

    def __exit__(self, *exc):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            for p in self.procs:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass


# ---------------------------------------------------------------- run on the workers
def setup_trainer(model_dir: str, seed: int):
    import torch

    from rose.runtime.trainer import Trainer
    from rose.runtime.weights.publisher import RankPublisher
    from rose.runtime.worker.plugin import rose_worker

    torch.set_num_threads(1)
    w = rose_worker()
    w.host.trainer = Trainer(model_dir, seed=seed)
    w.weights.reset(DTYPE)
    w.host.publisher = RankPublisher(DTYPE, w.weights.shard_bytes)
    w.host.publish()  # as a run's trainer publishes
    w.weights.mark_synced(0)
    # Beside it, the publisher's device path (what a CUDA trainer runs; forced on here, where the "device"
    # is the CPU): the bytes it would copy to the host, and whether its shards are the host path's.
    w.host.device_probe = (RankPublisher(DTYPE, w.weights.shard_bytes, on_device=True), {})
    _probe(w)  # the receivers adopt version 0 from the checkpoint
    return sum(p.numel() for p in w.host.trainer.model.parameters())


def _probe(w) -> dict:
    """Publish the trainer's weights again through the device path; compare with what was published."""
    pub, store = w.host.device_probe
    own, data, _ = pub.part(w.host.trainer.model.state_dict(), w.host.trainer.version, store.__getitem__)
    store.update(data)
    for h in set(store) - own.hashes():
        del store[h]
    return {"device_copy_bytes": pub.host_bytes, "version_bytes": own.nbytes,
            "device_path_exact": own == w.weights.manifest}


def setup_receiver(model_dir: str):
    from rose.models.loading import load_checkpoint
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    w.weights.reset(DTYPE)
    w.weights.adopt(load_checkpoint(model_dir), 0)
    return w.weights.version


def train_and_publish(lr: float, step: int, seed: int) -> dict:
    """One real GRPO step on random token sequences (8 groups x 4), then publish the new version."""
    import numpy as np
    import pyarrow as pa
    import torch

    from rose.config import GRPOConfig
    from rose.runtime.trajectory import Trajectory, to_batch
    from rose.runtime.weights import delta
    from rose.runtime.weights.bound import version_bound_bytes
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    vocab = w.host.trainer.model.config.vocab_size
    g = torch.Generator().manual_seed(seed * 1000 + step)
    trajs = []
    for gi in range(8):
        prompt = torch.randint(5, vocab, (16,), generator=g).tolist()
        for si in range(4):
            t = Trajectory(step, gi, si, "random", 0)
            t.add_context(prompt)
            gen = torch.randint(5, vocab, (32,), generator=g).tolist()
            t.add_generated(gen, [-5.0] * len(gen), [step] * len(gen))  # behaviour log-probs: a constant
            trajs.append(t)
    rewards = torch.rand(len(trajs), generator=g).tolist()
    table = pa.Table.from_batches([to_batch(trajs, rewards)])
    old = {k: v.detach().to(torch.bfloat16) for k, v in w.host.trainer.model.state_dict().items()}
    t0 = time.perf_counter()
    metrics = w.host.trainer.step(table, GRPOConfig(lr=lr, inner_epochs=1))
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    w.host.publish()
    publish_s = time.perf_counter() - t0
    bound = version_bound_bytes(w.weights.manifest, w.weights.prev, w.weights.store.get)  # for one receiver
    new = {k: v.detach().to(torch.bfloat16) for k, v in w.host.trainer.model.state_dict().items()}
    changed = sum(delta.changed_fraction(old[k], new[k]) * new[k].numel() for k in new)
    total = sum(v.numel() for v in new.values())
    return {"version": w.host.trainer.version, "changed_fraction": changed / total, "train_s": train_s,
            "publish_s": publish_s, **_probe(w), "bound_bytes": bound, "loss": metrics.get("loss", float("nan")),
            "np": int(np.int64(total))}


async def run_sync(receivers: list[str], mode: str, commit: bool) -> dict:
    from rose.runtime.weights.sync import sync_to
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    status = await sync_to(w.worker, w.weights, receivers, mode=mode, commit=commit)
    if commit:  # the next publish waits for this
        w.weights.mark_synced(w.weights.version)
    return status


def trainer_digest() -> dict:
    import torch

    from rose.runtime.weights.handlers import tensor_digest
    from rose.runtime.worker.plugin import rose_worker

    return {k: tensor_digest(v.to(torch.bfloat16)) for k, v in rose_worker().host.trainer.model.state_dict().items()}


def receiver_digest(dask_worker) -> dict:
    return dask_worker.plugins["rose"].weights._h_digest()


# ---------------------------------------------------------------- driver
def bench_case(client, trainer, receivers, model_dir, lr, steps, seed) -> dict:
    nparams = client.submit(setup_trainer, model_dir, seed, workers=[trainer], pure=False).result()
    client.gather([client.submit(setup_receiver, model_dir, workers=[r], pure=False) for r in receivers])
    rows = []
    for step in range(0, steps + 1):  # step 0 warms up both paths (first-touch memory, connections); not counted
        tr = client.submit(train_and_publish, lr, step, seed, workers=[trainer], pure=False).result()
        full = client.submit(run_sync, receivers, "full", False, workers=[trainer], pure=False).result()
        rose = client.submit(run_sync, receivers, "rose", True, workers=[trainer], pure=False).result()
        want = client.submit(trainer_digest, workers=[trainer], pure=False).result()
        got = client.run(receiver_digest, workers=receivers)
        exact = all(d == want for d in got.values())
        if step == 0:
            if not exact:
                raise RuntimeError("the warm-up sync did not end exact")
            continue
        rows.append({"step": step, **tr, "full": full, "rose": rose, "exact": exact})
        if os.environ.get("ROSE_BENCH_DEBUG"):
            print({k: rose[k] for k in ("transfer_s", "plan_s", "pull_s", "seconds", "sent_bytes", "timing")},
                  {k: full[k] for k in ("transfer_s", "plan_s", "pull_s")}, tr["publish_s"], file=sys.stderr)
    full_bytes = sum(r["full"]["sent_bytes"] for r in rows)
    sent = sum(r["rose"]["sent_bytes"] for r in rows)
    bound = sum(r["bound_bytes"] for r in rows) * len(receivers)
    t_full = sum(r["full"]["transfer_s"] for r in rows)
    t_rose = sum(r["rose"]["transfer_s"] for r in rows)
    return {"params": nparams, "rows": rows, "full_bytes": full_bytes, "sent_bytes": sent,
            "bytes_ratio": full_bytes / max(sent, 1), "bound_bytes": bound,
            "bytes_over_bound": sent / bound if bound > 0 else float("inf"), "time_full_s": t_full, "time_rose_s": t_rose,
            "speedup": t_full / t_rose if t_rose > 0 else float("inf"),
            "changed_fraction": sum(r["changed_fraction"] for r in rows) / len(rows),
            "exact": all(r["exact"] for r in rows),
            "cross_full": sum(r["full"]["cross_site_bytes"] for r in rows),
            "cross_rose": sum(r["rose"]["cross_site_bytes"] for r in rows),
            "refetches": sum(r["rose"]["refetches"] for r in rows),
            "device_copy_ratio": sum(r["device_copy_bytes"] for r in rows) / sum(r["version_bytes"] for r in rows),
            "device_path_exact": all(r["device_path_exact"] for r in rows)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="default model only, lr 1e-6, 2 steps (about 2 minutes)")
    ap.add_argument("--receivers", type=int, default=4, help="rollout receivers, split across the two sites")
    ap.add_argument("--rate", default="1gbit", help="link rate between the sites, in tc's notation")
    ap.add_argument("--steps", type=int, default=None, help="train steps (syncs) per case")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    steps = args.steps or (2 if args.quick else 3)

    from distributed import Client
    from tqdm import tqdm

    from rose.config import ModelConfig
    from rose.envs import env_class
    from rose.models import prepare_model

    models = {"default": prepare_model(ModelConfig(), env_class("guess"), seed=args.seed)}
    if not args.quick:
        # ~101 M parameters: 6 layers of width 1024 (no warm start: the sync does not care what it knows)
        big = ModelConfig(hidden_size=1024, num_layers=6, num_heads=16, warmstart_steps=0)
        models["101M"] = prepare_model(big, env_class("guess"), seed=args.seed)
    cases = [(m, lr) for m in models for lr in ((1e-6,) if args.quick else (1e-6, DEFAULT_LR))]

    results = {}
    with Link(args.rate) as link, Processes(args.receivers) as procs:
        with Client(procs.address, timeout=120) as client:
            client.wait_for_workers(1 + args.receivers, timeout=180)
            info = client.scheduler_info()["workers"]
            roles = {a: w["metrics"]["rose"]["role"] for a, w in info.items()}
            trainer = next(a for a, r in roles.items() if r == "trainer")
            receivers = sorted(a for a, r in roles.items() if r == "dedicated")
            for name, lr in tqdm(cases, desc="cases"):
                results[(name, lr)] = bench_case(client, trainer, receivers, models[name], lr, steps, args.seed)

    mb = 1 / 2**20
    print(f"\nweight sync: {args.receivers} receivers in 2 sites ({link.describe()}), bf16 weights, "
          f"{steps} steps per case")
    print(f"{'model':<8}{'params':>12}{'lr':>8}{'changed':>9}{'full MB':>10}{'rose MB':>9}{'ratio':>8}{'bound MB':>9}{'/bound':>8}"
          f"{'link full MB':>13}{'link rose MB':>13}{'full s':>8}{'rose s':>8}{'speedup':>9}{'exact':>7}"
          f"{'dev->host':>10}")
    for (name, lr), r in results.items():
        print(f"{name:<8}{r['params']:>12,}{lr:>8.0e}{r['changed_fraction']:>9.4f}{r['full_bytes'] * mb:>10.1f}"
              f"{r['sent_bytes'] * mb:>9.2f}{r['bytes_ratio']:>8.1f}{r['bound_bytes'] * mb:>9.2f}"
              f"{r['bytes_over_bound']:>8.3f}{r['cross_full'] * mb:>13.1f}"
              f"{r['cross_rose'] * mb:>13.2f}{r['time_full_s']:>8.2f}{r['time_rose_s']:>8.2f}{r['speedup']:>9.1f}"
              f"{str(r['exact']):>7}{r['device_copy_ratio']:>10.4f}")
    headline = ("101M" if "101M" in models else "default", 1e-6)
    h = results[headline]
    print(f"\nheadline: model {headline[0]}, lr {headline[1]:.0e} (targets: bytes_ratio >= 30, speedup >= 10, "
          "bytes_over_bound <= 1.15, exact)\n")
    print(json.dumps({"bench": "weight_sync", "params": h["params"], "receivers": args.receivers,
                      "changed_fraction": round(h["changed_fraction"], 5), "full_bytes": h["full_bytes"],
                      "sent_bytes": h["sent_bytes"], "bytes_ratio": round(h["bytes_ratio"], 1),
                      "bound_bytes": round(h["bound_bytes"]), "bytes_over_bound": round(h["bytes_over_bound"], 3),
                      "time_full_s": round(h["time_full_s"], 3), "time_rose_s": round(h["time_rose_s"], 3),
                      "speedup": round(h["speedup"], 1), "exact": h["exact"], "link": link.describe(),
                      "device_copy_ratio": round(h["device_copy_ratio"], 4),
                      "device_path_exact": h["device_path_exact"],
                      "model": headline[0], "lr": headline[1], "quick": args.quick}))


if __name__ == "__main__":
    asyncio.get_event_loop_policy()  # (asyncio is used by run_sync on the workers)
    main()
