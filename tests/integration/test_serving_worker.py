"""A real serving worker: its HTTP endpoint under load while rollout tasks run on the same engines' device."""
import asyncio
import json

import aiohttp
import pytest

import rose
from rose.config import ClusterConfig, EngineConfig
from tests.integration.helpers import small_pipeline

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def serving_cluster():
    from distributed import Client

    from rose.envs import env_class

    from rose.models import prepare_model
    from rose.runtime.cluster import LocalRoseCluster

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    cfg = ClusterConfig(num_dedicated=0, num_serving=1, serving_model=model_dir, serving_tpot_ms=200.0)
    with LocalRoseCluster(cfg, EngineConfig(dtype="float32")) as c, Client(c) as client:
        yield client


def _serving_url(client) -> str:
    (w,) = [w for w in client.scheduler_info()["workers"].values() if w["metrics"]["rose"]["role"] == "serving"]
    return f"http://127.0.0.1:{w['metrics']['rose']['http_port']}"


async def _load(url, n):
    async with aiohttp.ClientSession(url) as http:
        async def one(i):
            body = {"prompt": "guess", "max_tokens": 8, "stream": i % 2 == 0, "ignore_eos": True}
            async with http.post("/v1/completions", json=body) as r:
                return r.status, await r.text()
        out = []
        for _ in range(n):  # a steady trickle while the rollouts run
            out += await asyncio.gather(*(one(i) for i in range(4)))
            await asyncio.sleep(0.05)
        async with http.post("/v1/completions", data=b"{oops", headers={"Content-Type": "application/json"}) as r:
            bad = r.status
        async with http.get("/metrics") as r:
            metrics = await r.text()
        return out, bad, metrics


def test_rollouts_on_a_serving_worker_while_it_serves_http(serving_cluster):
    client = serving_cluster
    url = _serving_url(client)
    p = small_pipeline("guess", groups=4, group_size=4, steps=2)  # the only rollout worker: the serving one

    async def both():
        loop = asyncio.get_running_loop()
        run = loop.run_in_executor(None, lambda: rose.run(p, cluster=client, progress=False))
        load = await _load(url, 15)
        return await run, load

    report, (served, bad, metrics) = asyncio.run(both())
    t = report.trajectories
    assert sorted(t["trajectory_id"].to_pylist()) == sorted(f"s{s}-g{g}-i{i}" for s in range(2) for g in range(4)
                                                            for i in range(4))
    assert set(t["placement"].to_pylist()) == {"serving"} and report.lost == 0
    assert report.metrics["weight_version"].tolist() == [1, 2]  # the serving worker's rollout engine was synced
    assert (report.metrics["logprob_mismatch"] < 1e-4).all()
    for row in t.to_pylist():
        gen = [v for v, m in zip(row["weight_versions"], row["loss_mask"]) if m]
        assert set(gen) == {row["step"]}
    assert all(status == 200 for status, _ in served), [s for s in served if s[0] != 200][:2]
    assert sum(json.loads(b)["usage"]["completion_tokens"] for s, b in served if not b.startswith("data:")) > 0
    assert bad == 400
    assert "rose_rollout_tokens_total" in metrics and "rose_serving_ttft_ms_bucket" in metrics


def test_rollout_work_cannot_come_through_http(serving_cluster):
    url = _serving_url(serving_cluster)

    async def probe():
        async with aiohttp.ClientSession(url) as http:
            async with http.post("/v1/rollouts", json={}) as r:
                return r.status
    assert asyncio.run(probe()) in (404, 405)


def test_serve_load_reads_the_same_figures_from_a_rose_serving_worker(serving_cluster):
    from rose.runtime.coserve import traffic

    url = _serving_url(serving_cluster)
    arrivals = traffic.synthetic(4.0, 3.0, (8, 24), (4, 12), None, seed=3)
    report = asyncio.run(traffic.play(url, arrivals, ttft_ms=10_000, tpot_ms=10_000))
    assert report.summary()["errors"] == 0, [r.error for r in report.results][:3]
    assert [r.tokens for r in report.results] == [a.max_tokens for a in arrivals]  # from the usage chunk
    assert all(r.ttft_ms is not None and r.tpot_ms is not None for r in report.results)

    async def usage_chunk():  # OpenAI's stream_options.include_usage, as the client asks for it
        async with aiohttp.ClientSession(url) as http:
            body = {"prompt": "guess", "max_tokens": 3, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            async with http.post("/v1/completions", json=body) as r:
                chunks = [json.loads(line[6:]) async for line in r.content
                          if line.startswith(b"data: {")]
            async with http.post("/v1/completions", json={**body, "stream_options": {"include_usage": 1}}) as r:
                return chunks, r.status
    chunks, bad = asyncio.run(usage_chunk())
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["choices"] for c in chunks[:-1]) and bad == 400
