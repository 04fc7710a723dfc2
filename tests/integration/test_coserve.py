"""The co-serving executor with two real vLLM engines in one process (run in a subprocess: vLLM
changes process state at import that later worker processes must not inherit)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_preempted_rollouts_resume_exactly_while_serving_runs():
    import rose
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "helpers", "coserve_check.py"),
                          model_dir], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    plain, pre = seen["plain"], seen["preempted"]
    assert plain["preemptions"] == 0 and pre["preemptions"] > 0
    # greedy decoding resumed from prompt + tokens so far gives the same tokens: none lost or repeated
    assert pre["tokens"] == plain["tokens"]
    assert all(len(t) == n for t, n in zip(pre["tokens"], pre["logprobs_len"]))
    assert all(v == [0] * len(t) for v, t in zip(pre["versions"], pre["tokens"]))
    assert pre["serving"] == plain["serving"] and all(len(s) > 0 for s in pre["serving"])
