"""Run in its own process by tests/integration/test_engine_outputs.py: the same seeded request through a
real vLLM engine behind the engine loop, streaming and not (`VllmEngine(stream=...)`). Prints one JSON
line per mode: the tokens and log-probs the caller got, how many outputs the engine's iterations gave
for it, and its queue and total seconds; and the same request streamed without log-probs; the RMS norm
implementations the engine dispatches to; and, for a conversation's second turn, how many of its prompt
tokens vLLM found in its prefix cache."""
import json
import os
import sys
from dataclasses import replace

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(model_dir: str) -> None:
    from rose.config import EngineConfig
    from rose.runtime.engine import EngineLoop, SamplingSpec
    from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

    cfg = EngineConfig(dtype="float32")
    configure_vllm_env(cfg)
    loop = EngineLoop(lambda: VllmEngine(model_dir, cfg, 128, seed=0))
    outputs: dict[str, int] = {}
    step = loop.engine.step

    def counted():  # on the loop's thread
        outs = step()
        for o in outs:
            outputs[o.request_id] = outputs.get(o.request_id, 0) + 1
        return outs

    loop.engine.step = counted
    cached: dict[str, int] = {}  # vLLM request id -> prompt tokens its prefix cache held (vLLM's own figure)
    vllm_step = loop.engine._engine.step

    def watched():  # on the loop's thread
        outs = vllm_step()
        for o in outs:
            cached.setdefault(o.request_id, o.num_cached_tokens or 0)
        return outs

    loop.engine._engine.step = watched
    from vllm import ir
    from vllm.platforms import current_platform

    # The RMS norms the built engine dispatches to, first choice first (cpu_norms.py)
    seen = {"norms": {op: getattr(ir.ops, op).get_priority() for op in ("rms_norm", "fused_add_rms_norm")},
            "cpu": current_platform.is_cpu()}
    try:
        # A 4-token prompt fills no KV block, so the second request computes what the first did.
        spec = SamplingSpec(max_tokens=24, temperature=1.0, seed=7)
        for stream in (True, False):
            loop.engine.stream = stream  # read by add_request, on the loop's thread, after this
            g = loop.generate([1, 6, 9, 12], spec, request_id=f"stream-{stream}").result(timeout=300)
            rid = next(k for k in outputs if k.startswith(f"stream-{stream}#"))
            seen[str(stream)] = {"tokens": g.token_ids, "logprobs": g.logprobs, "versions": g.weight_versions,
                                 "outputs": outputs[rid], "queue_s": g.queue_s, "total_s": g.total_s}
        # A request that asks for no log-probs (a serving request): the same tokens, and no log-probs.
        loop.engine.stream = True
        g = loop.generate([1, 6, 9, 12], replace(spec, logprobs=False), request_id="bare").result(timeout=300)
        seen["bare"] = {"tokens": g.token_ids, "logprobs": g.logprobs, "finish_reason": g.finish_reason}
        # Two turns of one conversation: the second's prompt is the first's, its reply and a new message.
        first = [1] + [5 + i % 50 for i in range(70)]
        g = loop.generate(first, spec, request_id="turn-1").result(timeout=300)
        second = first + g.token_ids + [3, 4, 5, 6]
        loop.generate(second, spec, request_id="turn-2").result(timeout=300)
        seen["turn"] = {"prompt": len(second), "block": loop.engine._engine.vllm_config.cache_config.block_size,
                        "cached": next(v for k, v in cached.items() if k.startswith("turn-2"))}
    finally:
        loop.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
