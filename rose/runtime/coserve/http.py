"""The serving role's HTTP front end: an OpenAI-compatible subset for online traffic.

`POST /v1/completions` (prompt as text or token ids; `"stream": true` gives server-sent events),
`GET /v1/models`, `GET /metrics` (Prometheus text: TTFT/TPOT histograms, SLO attainment, rollout
tokens, preemptions). Requests go to the co-serving executor's serving engine only: rollout work
cannot be submitted here. A bad request gets a 4xx with a message and the server stays up; a client
that goes away mid-stream has its request aborted.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from rose.runtime.coserve.slo import SloConfig
from rose.runtime.engine.base import SamplingSpec

logger = logging.getLogger("rose.coserve.http")

MAX_BODY_BYTES = 1 << 20  # larger request bodies are refused (413)
MAX_PROMPT_ITEMS = 1 << 16
TTFT_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
TPOT_BUCKETS_MS = (5, 10, 20, 40, 80, 160, 320, 640)


class _Histogram:
    def __init__(self, name: str, help_: str, buckets):
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.n += 1
        self.total += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def text(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cum = 0
        for b, c in zip(self.buckets, self.counts):
            cum += c
            lines.append(f'{self.name}_bucket{{le="{b}"}} {cum}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.n}')
        lines += [f"{self.name}_sum {self.total}", f"{self.name}_count {self.n}"]
        return lines


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ServingFrontend:
    def __init__(self, executor, tokenizer, model_name: str, max_model_len: int, slo: SloConfig):
        self.executor = executor
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.slo = slo
        self.ttft = _Histogram("rose_serving_ttft_ms", "time to first token (ms)", TTFT_BUCKETS_MS)
        self.tpot = _Histogram("rose_serving_tpot_ms", "mean time per output token after the first (ms)",
                               TPOT_BUCKETS_MS)
        self.requests = 0
        self.slo_met = 0
        self.rejected = 0
        self.aborted = 0
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---------------------------------------------------------------- handlers
    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "rose", "max_model_len": self.max_model_len,
             "vocab_size": len(self.tokenizer)}]})

    async def metrics(self, request: web.Request) -> web.Response:
        st = self.executor.stats
        lines = self.ttft.text() + self.tpot.text() + [
            "# TYPE rose_serving_requests_total counter", f"rose_serving_requests_total {self.requests}",
            "# TYPE rose_serving_slo_met_total counter", f"rose_serving_slo_met_total {self.slo_met}",
            "# TYPE rose_serving_slo_attainment gauge",
            f"rose_serving_slo_attainment {self.slo_met / self.requests if self.requests else 1.0}",
            "# TYPE rose_serving_rejected_total counter", f"rose_serving_rejected_total {self.rejected}",
            "# TYPE rose_serving_aborted_total counter", f"rose_serving_aborted_total {self.aborted}",
            "# TYPE rose_rollout_tokens_total counter", f"rose_rollout_tokens_total {st['rollout_tokens']}",
            "# TYPE rose_rollout_preemptions_total counter", f"rose_rollout_preemptions_total {st['preemptions']}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def _parse(self, body: dict) -> tuple[list[int], SamplingSpec, bool]:
        if not isinstance(body, dict):
            raise BadRequest(400, "the body must be a JSON object")
        model = body.get("model", self.model_name)
        if model != self.model_name:
            raise BadRequest(404, f"unknown model {model!r}; this server serves {self.model_name!r}")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
            ids += self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in prompt[:MAX_PROMPT_ITEMS]):
            if len(prompt) > MAX_PROMPT_ITEMS:
                raise BadRequest(413, f"prompt of {len(prompt)} tokens is too large")
            ids = list(prompt)
            vocab = len(self.tokenizer)
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise BadRequest(400, f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")
        else:
            raise BadRequest(400, "field 'prompt' must be a string or a non-empty list of token ids")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest(400, f"field 'max_tokens' must be a positive integer, got {max_tokens!r}")
        if len(ids) + max_tokens > self.max_model_len:
            raise BadRequest(400, f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                                  f"context of {self.max_model_len} tokens")
        temperature = body.get("temperature", 1.0)
        top_p = body.get("top_p", 1.0)
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 10:
            raise BadRequest(400, f"field 'temperature' must be in [0, 10], got {temperature!r}")
        if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise BadRequest(400, f"field 'top_p' must be in (0, 1], got {top_p!r}")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise BadRequest(400, f"field 'seed' must be a non-negative integer, got {seed!r}")
        stop = (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ()
        if body.get("ignore_eos"):
            stop = ()
        spec = SamplingSpec(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                            stop_token_ids=stop, seed=seed)
        return ids, spec, bool(body.get("stream", False))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        t_arrival = time.perf_counter()
        try:
            try:
                body = await request.json()
            except web.HTTPRequestEntityTooLarge:
                raise BadRequest(413, f"request body over {MAX_BODY_BYTES} bytes") from None
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
                raise BadRequest(400, f"malformed JSON: {e}") from None
            ids, spec, stream = self._parse(body)
        except BadRequest as e:
            self.rejected += 1
            return web.json_response({"error": {"message": str(e), "type": "invalid_request_error",
                                                "code": e.status}}, status=e.status)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        req = self.executor.serve(ids, spec, on_delta=lambda *d: loop.call_soon_threadsafe(q.put_nowait, d))
        rid = f"cmpl-{req.request_id}"
        tokens: list[int] = []
        t_first = None
        reason = None
        resp = None
        try:
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await resp.prepare(request)
            while True:
                new, done, reason = await q.get()
                if new and t_first is None:
                    t_first = time.perf_counter()
                tokens += new
                if stream and (new or done):
                    chunk = {"id": rid, "object": "text_completion", "model": self.model_name,
                             "choices": [{"index": 0, "text": self.tokenizer.decode(new, skip_special_tokens=True),
                                          "token_ids": new, "finish_reason": reason if done else None}]}
                    await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if done:
                    break
        except (asyncio.CancelledError, ConnectionResetError):
            self.executor.abort_serving(req.request_id)  # the client went away: free its slot and memory
            self.aborted += 1
            raise
        self._record(t_arrival, t_first, len(tokens))
        if reason is not None and reason.startswith("error"):
            if stream:
                await resp.write_eof()
                return resp
            return web.json_response({"error": {"message": reason, "type": "invalid_request_error",
                                                "code": 400}}, status=400)
        if stream:
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(tokens), "total_tokens": len(ids) + len(tokens)}
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return web.json_response({"id": rid, "object": "text_completion", "created": int(time.time()),
                                  "model": self.model_name, "usage": usage,
                                  "choices": [{"index": 0, "text": text, "token_ids": tokens,
                                               "finish_reason": reason}]})

    def _record(self, t_arrival: float, t_first: float | None, n_tokens: int) -> None:
        self.requests += 1
        if t_first is None:
            return
        ttft = (t_first - t_arrival) * 1e3
        self.ttft.observe(ttft)
        ok = ttft <= self.slo.ttft_ms
        if n_tokens > 1:
            tpot = (time.perf_counter() - t_first) * 1e3 / (n_tokens - 1)
            self.tpot.observe(tpot)
            ok = ok and tpot <= self.slo.tpot_ms
        self.slo_met += ok
