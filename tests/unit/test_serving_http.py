"""The serving HTTP front end on a real loopback server; the engines are FakeEngines (logic only)."""
import asyncio
import json
import time

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.http import ServingFrontend
from rose.runtime.coserve.http_limits import MAX_BODY_BYTES, HttpLimits
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


async def _with_server(tok, body, engine=FakeEngine, limits=HttpLimits()):
    slo = SloConfig(ttft_ms=1000, tpot_ms=100)
    ex = CoServingExecutor(engine(vocab_size=len(tok), max_model_len=128), FakeEngine(), SloController(slo))
    front = ServingFrontend(ex, tok, "tiny", 128, slo, limits)
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
    (b"[" * 100_000 + b"]" * 100_000, 400, "malformed JSON: RecursionError"),  # too deep for the parser
    (b'{"prompt": "\xff\xfe\x00"}', 400, "malformed JSON"),  # not UTF-8
    (b'{"prompt": "guess", "temperature": NaN}', 400, "'temperature' must be in"),
    (json.dumps({"prompt": "guess", "temperature": True}).encode(), 400, "'temperature' must be in"),
    (json.dumps({"prompt": "guess", "max_tokens": 10**30}).encode(), 400, "exceeds the model's context"),
    (json.dumps({"prompt": "guess", "max_tokens": 2.5}).encode(), 400, "'max_tokens' must be a positive integer"),
    (json.dumps({"prompt": "guess", "stream": "yes"}).encode(), 400, "'stream' must be true or false"),
    (json.dumps({"prompt": [True, 1]}).encode(), 400, "'prompt' must be"),
    (json.dumps({"prompt": "guess", "seed": -1}).encode(), 400, "'seed' must be a non-negative integer"),
    (json.dumps({}).encode(), 400, "'prompt' must be"),
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


# ------------------------------------------------------------------ hostile clients
# A real server on loopback in a thread of its own, so that plain sockets and a synchronous client
# (hypothesis drives examples synchronously) can talk to it as outside clients do.
LIMITS = HttpLimits(body_timeout_s=0.5, idle_timeout_s=0.5, write_timeout_s=1.0)


@pytest.fixture
def live(tok):
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-http", daemon=True)
    thread.start()
    slo = SloConfig(ttft_ms=1000, tpot_ms=100)
    ex = CoServingExecutor(FakeEngine(vocab_size=len(tok), max_model_len=128), FakeEngine(), SloController(slo))
    front = ServingFrontend(ex, tok, "tiny", 128, slo, LIMITS)
    port = asyncio.run_coroutine_threadsafe(front.start(), loop).result(10)
    yield front, port
    asyncio.run_coroutine_threadsafe(front.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    ex.close()


def _post(port, body: bytes, headers=None) -> tuple[int, dict | str]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json",
                                                                     **(headers or {})})
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text
    finally:
        conn.close()


def _good(port) -> None:
    status, out = _post(port, json.dumps({"prompt": "guess", "max_tokens": 2, "ignore_eos": True}).encode())
    assert status == 200 and len(out["choices"][0]["token_ids"]) == 2, out


def _raw(port, data: bytes):
    import socket

    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(data)
    return s


def _read_all(s) -> bytes:
    """Everything the server sends until it closes the connection (or 30 s: then the test fails)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_a_client_that_stalls_mid_body_gets_408_and_others_are_served_meanwhile(live):
    front, port = live
    stalled = [_raw(port, HEAD + b"Content-Length: 100\r\n\r\n{\"prompt\": ") for _ in range(20)]
    _good(port)  # served while twenty clients hold half-sent bodies
    for s in stalled:
        answer = _read_all(s)
        assert answer.startswith(b"HTTP/1.1 408") and b"not received within 0.5 s" in answer, answer[:300]
    _good(port)


def test_a_client_that_hangs_up_mid_body_is_counted_not_logged_as_a_server_error(live, caplog):
    import logging
    import time

    front, port = live
    before = front.rejected
    with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
        for _ in range(5):
            _raw(port, HEAD + b"Content-Length: 100\r\n\r\n{\"prompt\": ").close()
        deadline = time.monotonic() + 10
        while front.rejected < before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert front.rejected == before + 5
    assert [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"] == []
    _good(port)


def test_a_client_that_stalls_in_its_headers_is_disconnected(live):
    front, port = live
    stalled = [_raw(port, HEAD) for _ in range(20)]  # headers never finished
    silent = _raw(port, b"")  # connects and says nothing
    _good(port)
    for s in stalled + [silent]:
        assert _read_all(s) == b""  # closed by the server, not left open for an hour


def test_a_declared_huge_body_is_refused_at_once(live):
    front, port = live
    s = _raw(port, HEAD + b"Content-Length: 100000000000\r\n\r\n{")  # sends a byte, claims 100 GB
    answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 413") and b"over the limit" in answer, answer[:300]
    _good(port)


def test_a_bad_charset_header_is_not_trusted(live):
    front, port = live
    status, out = _post(port, json.dumps({"prompt": "guess", "max_tokens": 1}).encode(),
                        {"Content-Type": "application/json; charset=no-such-codec"})
    assert status == 200, out


def test_many_concurrent_bad_requests_each_get_a_4xx_and_good_ones_go_through(live):
    from concurrent.futures import ThreadPoolExecutor

    front, port = live
    bad = [b"{not json", b"[]", json.dumps({"prompt": 12}).encode(), json.dumps({"prompt": [1, -5]}).encode(),
           json.dumps({"prompt": "guess", "max_tokens": 0}).encode(), b"[" * 50_000]
    good = json.dumps({"prompt": "guess", "max_tokens": 2, "ignore_eos": True}).encode()
    bodies = [bad[i % len(bad)] if i % 8 else good for i in range(160)]
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda b: _post(port, b), bodies))
    for body, (status, out) in zip(bodies, results):
        if body is good:
            assert status == 200, out
        else:
            assert 400 <= status < 500 and out["error"]["message"], (body[:40], status, out)
    assert front.rejected == sum(b is not good for b in bodies)
    _good(port)


# Fuzzed bodies: JSON of any shape, and the fields the endpoint reads given values of any JSON type.
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) |
                           st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4),
                           max_leaves=12)
fields = st.fixed_dictionaries({}, optional={
    "model": json_values | st.just("tiny"), "prompt": json_values | st.text(max_size=40) |
    st.lists(st.integers(-5, 200), max_size=40), "max_tokens": json_values | st.integers(-3, 200),
    "temperature": json_values, "top_p": json_values, "seed": json_values, "stream": json_values | st.booleans(),
    "ignore_eos": json_values})
bodies = (fields.map(lambda d: json.dumps(d).encode()) | json_values.map(lambda v: json.dumps(v).encode()) |
          st.binary(max_size=200))


@given(body=bodies)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_bodies_get_an_answer_never_a_server_error(live, body):
    front, port = live
    status, out = _post(port, body)
    assert status == 200 or 400 <= status < 500, (status, out)
    if status != 200:
        assert isinstance(out, dict) and out["error"]["message"], out
    else:  # json.dumps writes NaN/Infinity, which json.loads reads back: a 200 needs valid fields
        assert "choices" in out


def test_the_server_still_serves_after_the_fuzzing(live):
    front, port = live
    for body in (b"\x00" * 100, b"{" * 10, b'{"prompt": "guess", "max_tokens": 1e309}'):
        status, _ = _post(port, body)
        assert 400 <= status < 500
    _good(port)


def test_requests_that_run_longer_than_the_idle_timeout_are_not_cut(tok):
    # The idle timeout is for connections without a request; one being answered keeps its connection.
    async def body(http, front, ex):
        for stream in (False, True):
            async with http.post("/v1/completions", json={"prompt": [1, 5], "max_tokens": 120, "stream": stream,
                                                          "ignore_eos": True}) as r:
                assert r.status == 200
                text = await r.text()
            n = sum(len(json.loads(e[6:])["choices"][0]["token_ids"]) for e in text.splitlines()
                    if e.startswith("data: {")) if stream else len(json.loads(text)["choices"][0]["token_ids"])
            assert n == 120
        assert front.aborted == 0
    # 120 engine steps of >= 5 ms each outlast an idle timeout of 0.2 s
    asyncio.run(_with_server(tok, body, engine=SlowFake, limits=HttpLimits(idle_timeout_s=0.2)))


@pytest.mark.parametrize("field, value", [("max_body_bytes", 0), ("body_timeout_s", 0), ("idle_timeout_s", -1),
                                          ("write_timeout_s", float("inf"))])
def test_http_limits_are_validated(field, value):
    from rose.errors import ConfigError

    with pytest.raises(ConfigError, match=f"HttpLimits.{field}"):
        HttpLimits(**{field: value})


class _Transport:
    def __init__(self, buffered: int):
        self.buffered = buffered

    def is_closing(self):
        return False

    def get_write_buffer_size(self):
        return self.buffered


class _StuckResponse:
    """A streaming response whose client reads nothing: a write that has to wait never finishes."""

    def __init__(self):
        self.written = []

    async def write(self, data):
        self.written.append(data)
        await asyncio.Event().wait()


def test_a_chunk_that_must_wait_on_a_client_that_reads_nothing_drops_it_after_the_write_timeout(tok):
    from rose.runtime.coserve.http import ClientGone

    front = ServingFrontend(None, tok, "tiny", 128, SloConfig(ttft_ms=1000, tpot_ms=100),
                            HttpLimits(write_timeout_s=0.2))

    async def go(transport):
        resp = _StuckResponse()
        with pytest.raises(ClientGone, match="read nothing for 0.2 s"):
            await asyncio.wait_for(front._send(resp, b"data: x\n\n", transport), 5.0)
        return resp.written

    # with bytes already waiting in the connection's buffer, or without a transport, the timeout applies
    assert asyncio.run(go(_Transport(buffered=4096))) == [b"data: x\n\n"]
    assert asyncio.run(go(None)) == [b"data: x\n\n"]
