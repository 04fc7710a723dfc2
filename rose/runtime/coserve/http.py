"""The serving role's HTTP front end: an OpenAI-compatible subset for online traffic.

`POST /v1/completions` (prompt as text or token ids; `"stream": true` gives server-sent events),
`GET /v1/models`, `GET /metrics` (Prometheus text: TTFT/TPOT histograms, SLO attainment, rollout
tokens, preemptions). Requests go to the co-serving executor's serving engine only: rollout work
cannot be submitted here. A bad request gets a 4xx with a message and the server stays up; a client
that goes away mid-stream has its request aborted.

Hostile clients are bounded (`HttpLimits`): a body over `max_body_bytes` gets 413 (at once when its
Content-Length says so); a body not received within `body_timeout_s` gets 408 and the connection is
closed; a connection that never completes a request's headers is closed after `idle_timeout_s`; a
streaming client that stops reading for `write_timeout_s` is dropped and its request aborted. Each of
them costs the server a coroutine for that long, never a thread or the engine.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from rose.runtime.coserve.histogram import TPOT_BUCKETS_MS, TTFT_BUCKETS_MS, Histogram
from rose.runtime.coserve.http_limits import HttpLimits
from rose.runtime.coserve.outbox import Outbox
from rose.runtime.coserve.slo import SloConfig
from rose.runtime.engine.base import SamplingSpec

logger = logging.getLogger("rose.coserve.http")

MAX_PROMPT_ITEMS = 1 << 16


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ClientGone(Exception):
    """A streaming client stopped reading (write timeout) or closed its connection."""


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class ServingFrontend:
    def __init__(self, executor, tokenizer, model_name: str, max_model_len: int, slo: SloConfig,
                 limits: HttpLimits = HttpLimits()):
        self.executor = executor
        self.limits = limits
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.slo = slo
        self.ttft = Histogram("rose_serving_ttft_ms", "time to first token (ms)", TTFT_BUCKETS_MS)
        self.tpot = Histogram("rose_serving_tpot_ms", "mean time per output token after the first (ms)",
                               TPOT_BUCKETS_MS)
        self.requests = 0
        self.slo_met = 0
        self.rejected = 0
        self.aborted = 0
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self._outbox: Outbox | None = None  # the executor's deltas to this loop, a wake-up per batch

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=self.limits.idle_timeout_s)
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

    def _parse(self, body: dict) -> tuple[list[int], SamplingSpec, bool, bool]:
        """(prompt ids, sampling, stream, send usage at the end of the stream), or BadRequest."""
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
        if not _number(temperature) or not 0 <= temperature <= 10:  # NaN fails the comparison too
            raise BadRequest(400, f"field 'temperature' must be in [0, 10], got {temperature!r}")
        if not _number(top_p) or not 0 < top_p <= 1:
            raise BadRequest(400, f"field 'top_p' must be in (0, 1], got {top_p!r}")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise BadRequest(400, f"field 'seed' must be a non-negative integer, got {seed!r}")
        for flag in ("stream", "ignore_eos"):
            if not isinstance(body.get(flag, False), bool):
                raise BadRequest(400, f"field {flag!r} must be true or false, got {body[flag]!r}")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise BadRequest(400, f"field 'stream_options' must be an object with include_usage true or false, got "
                                  f"{body['stream_options']!r}")
        stop = (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ()
        if body.get("ignore_eos", False):
            stop = ()
        spec = SamplingSpec(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                            stop_token_ids=stop, seed=seed, logprobs=False)  # the reply carries text only
        stream = bool(body.get("stream", False))
        return ids, spec, stream, stream and options.get("include_usage", False)

    async def _body(self, request: web.Request):
        """The request's JSON body, or BadRequest (400 malformed, 408 too slow, 413 too large)."""
        limit = self.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise BadRequest(413, f"request body of {request.content_length} bytes is over the limit of {limit}")
        try:
            raw = await asyncio.wait_for(request.read(), self.limits.body_timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(408, f"request body not received within {self.limits.body_timeout_s:g} s") from None
        except web.HTTPRequestEntityTooLarge:
            raise BadRequest(413, f"request body over the limit of {limit} bytes") from None
        except ConnectionError as e:  # the client closed the connection mid-body: no one to answer
            raise ClientGone(f"client closed the connection mid-body: {e}") from None
        try:
            # bytes straight to json (it detects UTF-8/16/32): no charset from the client's headers to trust
            return json.loads(raw)
        except (ValueError, RecursionError) as e:  # RecursionError: nesting too deep for the parser
            raise BadRequest(400, f"malformed JSON: {type(e).__name__}: {str(e)[:200]}") from None

    def _refuse(self, e: BadRequest) -> web.Response:
        self.rejected += 1
        resp = web.json_response({"error": {"message": str(e), "type": "invalid_request_error", "code": e.status}},
                                 status=e.status)
        if e.status in (408, 413):
            resp.force_close()  # the rest of the body may never come: do not wait for it on this connection
        return resp

    async def _send(self, resp: web.StreamResponse, data: bytes, transport=None) -> None:
        """Write one chunk; a client that reads nothing for `write_timeout_s` is gone. Most writes find the
        connection's buffer empty and cannot wait on the client, so they skip the timeout's task and timer
        (98 µs a chunk, measured here on a busy core; the engines step on the same one)."""
        try:
            if transport is not None and not transport.is_closing() and transport.get_write_buffer_size() == 0:
                await resp.write(data)
            else:
                await asyncio.wait_for(resp.write(data), self.limits.write_timeout_s)
        except asyncio.TimeoutError:
            raise ClientGone(f"client read nothing for {self.limits.write_timeout_s:g} s") from None
        except (ConnectionResetError, ConnectionError) as e:
            raise ClientGone(str(e)) from None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        t_arrival = time.perf_counter()
        try:
            ids, spec, stream, with_usage = self._parse(await self._body(request))
        except BadRequest as e:
            return self._refuse(e)
        except ClientGone:
            self.rejected += 1
            return web.Response(status=400)  # never read: the client is gone
        if self._outbox is None or self._outbox.loop is not asyncio.get_running_loop():
            self._outbox = Outbox(asyncio.get_running_loop())
        q: asyncio.Queue = asyncio.Queue()
        req = self.executor.serve(ids, spec, on_delta=lambda *d: self._outbox.put(q.put_nowait, d))
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
                while not done and not q.empty():  # deltas that queued while this loop was busy: one chunk
                    more, done, reason = q.get_nowait()
                    new = new + more
                if new and t_first is None:
                    t_first = time.perf_counter()
                tokens += new
                if stream and (new or done):
                    chunk = {"id": rid, "object": "text_completion", "model": self.model_name,
                             "choices": [{"index": 0, "text": self.tokenizer.decode(new, skip_special_tokens=True),
                                          "token_ids": new, "finish_reason": reason if done else None}]}
                    await self._send(resp, f"data: {json.dumps(chunk)}\n\n".encode(), request.transport)
                if done:
                    break
        except (asyncio.CancelledError, ConnectionResetError, ClientGone) as e:
            self.executor.abort_serving(req.request_id)  # the client went away: free its slot and memory
            self.aborted += 1
            if isinstance(e, ClientGone):
                logger.info("dropped a streaming client: %s", e)
                if request.transport is not None:
                    request.transport.abort()
                return resp
            raise
        self._record(t_arrival, t_first, len(tokens))
        if reason is not None and reason.startswith("error"):
            if stream:
                await resp.write_eof()
                return resp
            return web.json_response({"error": {"message": reason, "type": "invalid_request_error",
                                                "code": 400}}, status=400)
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(tokens), "total_tokens": len(ids) + len(tokens)}
        if stream:
            try:
                if with_usage:  # OpenAI's stream_options.include_usage: a last chunk with no choices
                    chunk = {"id": rid, "object": "text_completion", "model": self.model_name, "choices": [],
                             "usage": usage}
                    await self._send(resp, f"data: {json.dumps(chunk)}\n\n".encode())
                await self._send(resp, b"data: [DONE]\n\n")
                await resp.write_eof()
            except ClientGone:  # it had every token; only the end marker was lost
                if request.transport is not None:
                    request.transport.abort()
            return resp
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
