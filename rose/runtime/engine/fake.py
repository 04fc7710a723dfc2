"""A deterministic fake engine for pure-logic unit tests. No figure or integration test uses it.

Each iteration every running request gets one token `(hash of request id + position) % vocab`
with log-prob -1.0; a request finishes on a stop token or at `max_tokens`. Cost model: none.
"""
from __future__ import annotations

import zlib

from rose.errors import PromptTooLongError
from rose.runtime.engine.base import EngineOutput, SamplingSpec


class FakeEngine:
    def __init__(self, vocab_size: int = 64, max_model_len: int = 128, script: dict[str, list[int]] | None = None):
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.script = script or {}  # request id prefix -> tokens to emit, in order
        self._version = 0
        self._reqs: dict[str, tuple[list[int], SamplingSpec, list[int]]] = {}

    @property
    def weight_version(self) -> int:
        return self._version

    def add_request(self, request_id, prompt_token_ids, spec):
        if len(prompt_token_ids) >= self.max_model_len:
            raise PromptTooLongError(f"prompt of {len(prompt_token_ids)} tokens does not fit "
                                     f"max_model_len={self.max_model_len}", request_id=request_id)
        self._reqs[request_id] = (list(prompt_token_ids), spec, [])

    def _next(self, rid: str, pos: int) -> int:
        for prefix, toks in self.script.items():
            if rid.startswith(prefix) and pos < len(toks):
                return toks[pos]
        return zlib.crc32(f"{rid}:{pos}".encode()) % self.vocab_size

    def step(self):
        outs = []
        for rid, (prompt, spec, gen) in list(self._reqs.items()):
            tok = self._next(rid, len(gen))
            gen.append(tok)
            stop = tok in spec.stop_token_ids
            length = len(gen) >= spec.max_tokens or len(prompt) + len(gen) >= self.max_model_len
            done = stop or length
            outs.append(EngineOutput(rid, [tok], [-1.0], done, ("stop" if stop else "length") if done else None))
            if done:
                del self._reqs[rid]
        return outs

    def abort(self, request_ids):
        for rid in request_ids:
            self._reqs.pop(rid, None)

    def has_unfinished(self):
        return bool(self._reqs)

    def num_running(self):
        return len(self._reqs)

    def kv_usage(self):
        return 0.0

    def load_weights(self, named_tensors, version):
        self._version = version
