"""Run in its own process by tests/integration/test_coserve.py: two real vLLM engines (serving and
rollout) in one co-serving executor. Prints one JSON line of what it saw."""
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(model_dir: str) -> None:
    from rose.config import EngineConfig
    from rose.runtime.coserve.executor import CoServingExecutor
    from rose.runtime.coserve.slo import IterationPlan, SloConfig, SloController
    from rose.runtime.engine import SamplingSpec
    from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

    class PreemptAt(SloController):
        """The real controller, except that on the given iterations it preempts all rollout work."""

        def __init__(self, at):
            # One rollout step an iteration, so that the rollouts are still running at the iterations named
            # (with a 60 s TPOT the budget holds 16 steps an iteration, and they finish within three)
            super().__init__(SloConfig(ttft_ms=60_000, tpot_ms=60_000, max_rollout_steps=1))
            self.at, self.n = set(at), 0

        def plan(self, serving, rollout):
            self.n += 1
            p = super().plan(serving, rollout)
            if self.n in self.at:
                return IterationPlan(p.serving_tokens, p.serving_ms, False,
                                     rollout_preempt=tuple(r.request_id for r in rollout.running))
            return p

    cfg = EngineConfig(dtype="float32")
    configure_vllm_env(cfg)
    make = lambda: VllmEngine(model_dir, cfg, 128, seed=0)  # noqa: E731
    greedy = SamplingSpec(max_tokens=24, temperature=0.0)
    prompts = [[1] + [5 + i, 9, 11 + i] for i in range(6)]

    def run(at):
        ex = CoServingExecutor(make, make, PreemptAt(at))
        try:
            served = [ex.serve([1, 7, 8, 9 + i], SamplingSpec(max_tokens=16, temperature=0.0)) for i in range(3)]
            gens = [f.result(timeout=300) for f in [ex.generate(p, greedy, request_id=f"r{i}")
                                                    for i, p in enumerate(prompts)]]
            serving_tokens = [s.collect(timeout=300)[0] for s in served]
            return {"tokens": [g.token_ids for g in gens], "versions": [g.weight_versions for g in gens],
                    "logprobs_len": [len(g.logprobs) for g in gens], "serving": serving_tokens,
                    "preemptions": ex.stats["preemptions"]}
        finally:
            ex.close()

    print(json.dumps({"plain": run(()), "preempted": run((3, 6, 9))}))


if __name__ == "__main__":
    main(sys.argv[1])
