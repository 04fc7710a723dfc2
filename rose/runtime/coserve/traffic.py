"""Serving traffic: arrival schedules, and a client that plays them against an HTTP endpoint.

Schedules are lists of `Arrival` (seconds from the start, prompt tokens, tokens to generate):
- `synthetic`: Poisson arrivals whose rate swings with a diurnal sine and jumps during on/off bursts;
- `azure_trace`: replay of a CSV in the Azure LLM inference trace format
  (`TIMESTAMP,ContextTokens,GeneratedTokens`), time-scaled and token-scaled to the model at hand.
`play` sends each request at its time as a streaming `/v1/completions` call and measures TTFT and
TPOT on the client side, as a user would see them.
"""
from __future__ import annotations

import asyncio
import csv
import json
import math
import random
import time
from dataclasses import dataclass, field
from datetime import datetime

from rose.errors import ConfigError


@dataclass(frozen=True)
class Arrival:
    t: float  # seconds from the start of the run
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Burst:
    every_s: float = 20.0  # a burst starts every this many seconds
    length_s: float = 4.0  # and lasts this long
    factor: float = 3.0  # arrival rate multiplier during a burst

    def __post_init__(self):
        if not (self.every_s > 0 and 0 < self.length_s <= self.every_s and self.factor >= 1):
            raise ConfigError(f"burst every={self.every_s}s length={self.length_s}s factor={self.factor}: need "
                              "every > 0, 0 < length <= every, factor >= 1")


def synthetic(rate: float, duration_s: float, prompt_tokens: tuple[int, int] = (16, 48),
              max_tokens: tuple[int, int] = (8, 32), burst: Burst | None = Burst(),
              diurnal_period_s: float = 0.0, diurnal_amplitude: float = 0.0, seed: int = 0) -> list[Arrival]:
    """Poisson arrivals at `rate` per second on average outside bursts (thinning of a bounded rate)."""
    if rate <= 0 or duration_s <= 0:
        raise ConfigError(f"rate={rate}/s and duration={duration_s}s must both be > 0")
    if not 0 <= diurnal_amplitude < 1:
        raise ConfigError(f"diurnal amplitude {diurnal_amplitude} must be in [0, 1)")
    rng = random.Random(seed)

    def rate_at(t: float) -> float:
        r = rate
        if diurnal_period_s > 0:
            r *= 1 + diurnal_amplitude * math.sin(2 * math.pi * t / diurnal_period_s)
        if burst is not None and (t % burst.every_s) < burst.length_s:
            r *= burst.factor
        return r

    peak = rate * (1 + diurnal_amplitude) * (burst.factor if burst else 1)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration_s:
            return out
        if rng.random() * peak <= rate_at(t):
            out.append(Arrival(t, rng.randint(*prompt_tokens), rng.randint(*max_tokens)))


def azure_trace(path: str, time_scale: float = 1.0, token_scale: float = 1.0, max_prompt: int = 64,
                max_gen: int = 32, duration_s: float | None = None, start_s: float = 0.0,
                gen_scale: float | None = None) -> list[Arrival]:
    """Arrivals from an Azure-format CSV. Gaps are multiplied by `time_scale` (0.1 = ten times the
    rate), context tokens by `token_scale` and generated ones by `gen_scale` (default: the same),
    then clipped to [1, max_prompt] and [1, max_gen]."""
    gen_scale = token_scale if gen_scale is None else gen_scale
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise ConfigError(f"{path}: not an Azure LLM inference trace (missing columns {sorted(missing)})")
        for i, row in enumerate(reader, start=2):
            try:
                ts = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]).timestamp()
                rows.append((ts, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            except (ValueError, TypeError) as e:
                raise ConfigError(f"{path}:{i}: bad row {row}: {e}") from None
    if not rows:
        raise ConfigError(f"{path}: no requests")
    t0 = rows[0][0] + start_s
    out = []
    for ts, ctx, gen in rows:
        if ts < t0:
            continue
        t = (ts - t0) * time_scale
        if duration_s is not None and t >= duration_s:
            break
        out.append(Arrival(t, max(1, min(max_prompt, round(ctx * token_scale))),
                           max(1, min(max_gen, round(gen * gen_scale)))))
    return out


def azure_trace_at_rate(path: str, rate: float, duration_s: float, token_scale: float = 0.03,
                        gen_scale: float = 0.1, max_prompt: int = 48, max_gen: int = 32) -> tuple[list[Arrival], float]:
    """The trace's first stretch, time-scaled so that `duration_s` seconds of it arrive at `rate`
    requests/s on average. Returns (arrivals, time scale). The stretch replayed depends on the scale,
    so the scale is settled by fixed-point iteration."""
    if not rate > 0:
        raise ConfigError(f"rate={rate} must be > 0 requests/s")
    full = azure_trace(path)
    if len(full) / rate <= duration_s:
        # The whole trace at `rate` lasts no longer than asked: replay all of it at that mean rate.
        scale = len(full) / max(full[-1].t, 1e-9) / rate
    else:
        scale = len(full) / max(full[-1].t, 1e-9) / rate
        for _ in range(20):
            span = duration_s / scale
            scale = sum(1 for a in full if a.t < span) / span / rate
    return azure_trace(path, time_scale=scale, token_scale=token_scale, gen_scale=gen_scale, max_prompt=max_prompt,
                       max_gen=max_gen, duration_s=duration_s), scale


@dataclass
class RequestResult:
    arrival: Arrival
    status: int = 0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tokens: int = 0
    error: str | None = None


@dataclass
class LoadReport:
    results: list[RequestResult] = field(default_factory=list)
    ttft_ms: float = 0.0  # the SLO the attainment was measured against
    tpot_ms: float = 0.0

    def ok(self, r: RequestResult) -> bool:
        return (r.status == 200 and r.ttft_ms is not None and r.ttft_ms <= self.ttft_ms
                and (r.tpot_ms is None or r.tpot_ms <= self.tpot_ms))

    @property
    def attainment(self) -> float:
        return sum(self.ok(r) for r in self.results) / len(self.results) if self.results else 1.0

    @staticmethod
    def _p(values, q):
        v = sorted(x for x in values if x is not None)
        return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")

    def summary(self) -> dict:
        rs = self.results
        return {"requests": len(rs), "errors": sum(r.status != 200 for r in rs),
                "slo_attainment": round(self.attainment, 4),
                "ttft_p50_ms": round(self._p([r.ttft_ms for r in rs], 0.5), 1),
                "ttft_p99_ms": round(self._p([r.ttft_ms for r in rs], 0.99), 1),
                "tpot_p50_ms": round(self._p([r.tpot_ms for r in rs], 0.5), 1),
                "tpot_p99_ms": round(self._p([r.tpot_ms for r in rs], 0.99), 1),
                "tokens": sum(r.tokens for r in rs)}


def _prompt(rng: random.Random, n: int, vocab: int | None):
    """`n` random token ids when the server states its vocabulary (ROSE's endpoint does: exact lengths);
    otherwise `n` random numbers as text, which any completions server takes (its tokenizer decides
    the length: the server's usage reports it)."""
    if vocab:
        return [rng.randrange(5, vocab) for _ in range(n)]
    return " ".join(str(rng.randrange(100)) for _ in range(n))


async def _one(http, a: Arrival, model: str, vocab: int | None, rng: random.Random) -> RequestResult:
    """One streamed request, timed from its chunks: the first chunk that carries a choice is the first
    token; the token count is the server's `usage` (asked for with OpenAI's stream_options), else the
    chunks' token_ids, else one per chunk."""
    import aiohttp

    res = RequestResult(a)
    body = {"model": model, "prompt": _prompt(rng, a.prompt_tokens, vocab), "max_tokens": a.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 1.0}
    t0 = time.perf_counter()
    t_first = t_last = None
    counted, usage = 0, None
    try:
        async with http.post("/v1/completions", json=body) as r:
            res.status = r.status
            if r.status != 200:
                res.error = (await r.text())[:300]
                return res
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    t_last = time.perf_counter()
                    t_first = t_first or t_last
                    counted += len(choice.get("token_ids") or ()) or 1
    except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as e:  # e.g. the server closed the connection
        res.error = f"{type(e).__name__}: {e}"
        return res
    except (ValueError, AttributeError, TypeError) as e:  # a chunk that is not an OpenAI completion chunk
        res.error = f"malformed stream chunk: {type(e).__name__}: {e}"
        return res
    res.tokens = int(usage["completion_tokens"]) if isinstance(usage, dict) and "completion_tokens" in usage \
        else counted
    if t_first is not None:
        res.ttft_ms = (t_first - t0) * 1e3
        if res.tokens > 1:
            res.tpot_ms = (t_last - t_first) * 1e3 / (res.tokens - 1)
    return res


async def play(url: str, arrivals: list[Arrival], ttft_ms: float, tpot_ms: float, seed: int = 0,
               progress=None, stop=None) -> LoadReport:
    """Send every arrival at its time; returns per-request client-side measurements. `stop` (a
    threading.Event): send no more once it is set, and report the requests already sent."""
    import aiohttp

    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    # Idle connections are closed on our side first (servers close theirs after their keep-alive
    # timeout, 15 s at ROSE's endpoint): a request sent on a connection the server is closing fails.
    async with aiohttp.ClientSession(url, timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=5.0)) as http:
        async with http.get("/v1/models") as r:
            info = (await r.json())["data"][0]
        model, vocab = info["id"], info.get("vocab_size")  # vocab_size: ROSE's endpoint says it; others need not
        start = time.perf_counter()
        tasks = []
        for a in arrivals:
            delay = start + a.t - time.perf_counter()
            while delay > 0 and not (stop is not None and stop.is_set()):
                await asyncio.sleep(min(delay, 0.2))
                delay = start + a.t - time.perf_counter()
            if stop is not None and stop.is_set():
                break
            tasks.append(asyncio.create_task(_one(http, a, model, vocab, rng)))
            if progress:
                progress(len(tasks))
        results = await asyncio.gather(*tasks)
    return LoadReport(list(results), ttft_ms, tpot_ms)


async def capacity(url: str, seconds: float, clients: int = 16) -> float:
    """Requests per second the endpoint completes with `clients` concurrent closed-loop clients
    (8-token prompts, 16 tokens out)."""
    import aiohttp

    done = 0
    t_end = time.perf_counter() + seconds
    async with aiohttp.ClientSession(url) as http:
        async def client():
            nonlocal done
            while time.perf_counter() < t_end:
                body = {"prompt": [1, 5, 6, 7, 8, 9, 10, 11], "max_tokens": 16, "ignore_eos": True}
                async with http.post("/v1/completions", json=body) as r:
                    await r.read()
                done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return done / (time.perf_counter() - t0)
