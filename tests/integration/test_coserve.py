"""The co-serving executor with two real vLLM engines in one process (run in a subprocess: vLLM
changes process state at import that later worker processes must not inherit)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_preempted_rollouts_resume_exactly_while_serving_runs():
    from tests.integration.helpers import run_engine_helper  # here: this file also runs as a script

    seen = run_engine_helper("coserve_check.py")
    plain, pre = seen["plain"], seen["preempted"]
    assert plain["preemptions"] == 0 and pre["preemptions"] > 0
    # greedy decoding resumed from prompt + tokens so far gives the same tokens: none lost or repeated
    assert pre["tokens"] == plain["tokens"]
    assert all(len(t) == n for t, n in zip(pre["tokens"], pre["logprobs_len"]))
    assert all(v == [0] * len(t) for v, t in zip(pre["versions"], pre["tokens"]))
    assert pre["serving"] == plain["serving"] and all(len(s) > 0 for s in pre["serving"])


def test_a_staged_reload_runs_beside_serving_and_is_exact():
    """Real engines: a weight reload applied in slices between serving steps leaves serving untouched
    and the rollout engine exactly where a whole reload leaves another engine (same tokens, same
    log-probs)."""
    import rose
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    out = subprocess.run([sys.executable, __file__, "swaps", model_dir], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["served_during_load"] == seen["served_alone"]
    assert seen["load_slices"] > 1  # it was cut between serving iterations
    assert seen["versions"] == [1] * len(seen["tokens"])  # one version, the new one
    assert seen["tokens"] == seen["whole"]["tokens"] and seen["logprobs"] == seen["whole"]["logprobs"]
    assert seen["logprobs"] != seen["before"]  # the weights did change


def swaps_main(model_dir: str) -> None:
    """Run as a script by the test above; prints one JSON line of what it saw."""
    import torch

    from rose.config import EngineConfig
    from rose.models.loading import load_checkpoint
    from rose.runtime.coserve.executor import CoServingExecutor
    from rose.runtime.coserve.slo import SloConfig, SloController
    from rose.runtime.engine import SamplingSpec
    from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

    cfg = EngineConfig(dtype="bfloat16")  # the staged weights are cast before the swap
    configure_vllm_env(cfg)
    serve_spec, roll_spec = SamplingSpec(max_tokens=60, temperature=0.0), SamplingSpec(max_tokens=40, temperature=0.0)
    # A 5 ms TPOT: the serving step leaves (almost) nothing, so the reload goes a step per iteration
    ex = CoServingExecutor(lambda: VllmEngine(model_dir, cfg, 128), None,
                           SloController(SloConfig(ttft_ms=60_000, tpot_ms=5)))
    try:
        alone = ex.serve([1, 7, 8, 9], serve_spec).collect(timeout=300)[0]
        ex.attach_rollout(lambda: VllmEngine(model_dir, cfg, 128, seed=0)).result(timeout=300)
        prompt = [1, 5, 9, 11]
        before = ex.generate(prompt, roll_spec).result(timeout=300).logprobs
        g = torch.Generator().manual_seed(0)
        new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in load_checkpoint(model_dir).items()}
        serving = ex.serve([1, 7, 8, 9], serve_spec)
        load = ex.load_weights(new, 1)
        after = ex.generate(prompt, roll_spec)  # queued behind the load
        load.result(timeout=300)
        gen = after.result(timeout=300)
        during_load = serving.collect(timeout=300)[0]
        whole = VllmEngine(model_dir, cfg, 128, seed=0)  # the reference: the same weights, loaded whole
        whole.load_weights(new, 1)
        whole.add_request("w", prompt, roll_spec)
        toks, lps = [], []
        while whole.has_unfinished():
            for o in whole.step():
                toks += o.token_ids
                lps += o.logprobs
        print(json.dumps({"served_alone": alone, "served_during_load": during_load,
                          "load_slices": ex.stats["load_slices"], "before": before, "tokens": gen.token_ids,
                          "logprobs": gen.logprobs, "versions": gen.weight_versions,
                          "whole": {"tokens": toks, "logprobs": lps}}))
    finally:
        ex.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if sys.argv[1] == "swaps":
        swaps_main(sys.argv[2])
