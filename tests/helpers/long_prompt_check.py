"""Run in its own process by tests/integration/test_bad_inputs.py: prompts that do not fit, sent
straight to a real vLLM engine behind the engine loop (past the rollout op's own check). Prints one
JSON line of what each request got, and whether the engine served a normal request afterwards."""
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

MAX_MODEL_LEN = 128


def main(model_dir: str) -> None:
    from rose.config import EngineConfig
    from rose.runtime.engine import EngineLoop, SamplingSpec
    from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

    cfg = EngineConfig(dtype="float32")
    configure_vllm_env(cfg)
    loop = EngineLoop(lambda: VllmEngine(model_dir, cfg, MAX_MODEL_LEN, seed=0))
    spec = SamplingSpec(max_tokens=16, temperature=0.0)
    seen = {}
    try:
        # Sent together: the bad ones must fail alone while the good one runs in the same iterations.
        cases = {"over": [1] + [5] * (MAX_MODEL_LEN + 50), "exact": [1] + [5] * (MAX_MODEL_LEN - 1),
                 "one_left": [1] + [5] * (MAX_MODEL_LEN - 2), "good": [1, 5, 9, 11]}
        futs = {k: loop.generate(p, spec, request_id=k) for k, p in cases.items()}
        for k, f in futs.items():
            try:
                g = f.result(timeout=300)
                seen[k] = {"ok": True, "tokens": len(g.token_ids), "finish_reason": g.finish_reason}
            except Exception as e:
                seen[k] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        g = loop.generate([1, 6, 9, 12], spec, request_id="after").result(timeout=300)
        seen["after"] = {"ok": True, "tokens": len(g.token_ids), "finish_reason": g.finish_reason}
    finally:
        loop.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
