"""The serving HTTP front end on a real loopback server; the engines are FakeEngines (logic only)."""
import asyncio
import json
import time

import aiohttp
import pytest

from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.http import MAX_BODY_BYTES, ServingFrontend
from rose.runtime.coserve.slo import SloConfig, SloController
from rose.runtime.engine.fake import FakeEngine


class SlowFake(FakeEngine):
    def step(self):
        time.sleep(0.005)
        return super().step()


@pytest.fixture
def tok():
    from rose.models.tiny import build_tokenizer

    return build_tokenizer(["guess", "higher", "lower"])


async def _with_server(tok, body, engine=FakeEngine):
    slo = SloConfig(ttft_ms=1000, tpot_ms=100)
    ex = CoServingExecutor(engine(vocab_size=len(tok), max_model_len=128), FakeEngine(), SloController(slo))
    front = ServingFrontend(ex, tok, "tiny", 128, slo)
    port = await front.start()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            return await body(http, front, ex)
    finally:
        await front.stop()
        ex.close()


def test_completions_models_metrics_and_stream(tok):
    async def body(http, front, ex):
        async with http.get("/v1/models") as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == "tiny"
        async with http.post("/v1/completions", json={"model": "tiny", "prompt": "guess 5", "max_tokens": 7,
                                                      "ignore_eos": True}) as r:
            out = await r.json()
            assert r.status == 200 and out["usage"]["completion_tokens"] == 7
            assert len(out["choices"][0]["token_ids"]) == 7
        async with http.post("/v1/completions", json={"prompt": [1, 5, 6], "max_tokens": 5, "stream": True,
                                                      "ignore_eos": True}) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = [line[6:] for line in (await r.text()).splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 5
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        async with http.get("/metrics") as r:
            text = await r.text()
            assert 'rose_serving_ttft_ms_bucket{le="+Inf"} 2' in text and "rose_serving_slo_attainment" in text
    asyncio.run(_with_server(tok, body))


@pytest.mark.parametrize("payload, status, words", [
    (b"{not json", 400, "malformed JSON"),
    (json.dumps({"model": "other", "prompt": "x"}).encode(), 404, "unknown model 'other'"),
    (json.dumps({"prompt": "guess", "max_tokens": 1000}).encode(), 400, "exceeds the model's context of 128"),
    (json.dumps({"prompt": "guess", "max_tokens": -3}).encode(), 400, "'max_tokens' must be a positive integer"),
    (json.dumps({"prompt": "guess", "temperature": 1e9}).encode(), 400, "'temperature' must be in"),
    (json.dumps({"prompt": [1, 10**9]}).encode(), 400, "outside the vocabulary"),
    (json.dumps({"prompt": 12}).encode(), 400, "'prompt' must be"),
    (json.dumps([1, 2]).encode(), 400, "JSON object"),
    (b'{"prompt": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}', 413, ""),
])
def test_bad_requests_get_a_4xx_and_the_server_stays_up(tok, payload, status, words):
    async def body(http, front, ex):
        async with http.post("/v1/completions", data=payload, headers={"Content-Type": "application/json"}) as r:
            assert r.status == status
            if words:
                assert words in (await r.json())["error"]["message"]
        async with http.post("/v1/completions", json={"prompt": "guess", "max_tokens": 2}) as r:
            assert r.status == 200
    asyncio.run(_with_server(tok, body))


def test_a_client_that_disconnects_mid_stream_has_its_request_aborted(tok):
    async def body(http, front, ex):
        async with http.post("/v1/completions", json={"prompt": [1, 5], "max_tokens": 120, "stream": True,
                                                      "ignore_eos": True}) as r:
            await r.content.readline()  # the first event arrived; now go away
        for _ in range(200):
            if front.aborted and not ex.serving.has_unfinished():
                break
            await asyncio.sleep(0.01)
        assert front.aborted == 1 and not ex.serving.has_unfinished()
    asyncio.run(_with_server(tok, body, engine=SlowFake))
