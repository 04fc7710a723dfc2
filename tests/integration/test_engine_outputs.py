"""A dedicated worker's engine returns each request's tokens at its first token and at its end only
(`VllmEngine(stream=False)`): the caller gets the same tokens, log-probs and queue time as when every
token streams."""
import json
import os
import subprocess
import sys

import pytest

import rose


def test_an_engine_that_does_not_stream_gives_the_same_generation_in_two_outputs():
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "helpers",
                                                       "stream_check.py"), model_dir],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    streamed, whole = seen["True"], seen["False"]
    n = len(streamed["tokens"])
    assert n > 2  # long enough that the two modes differ in outputs
    assert streamed["outputs"] == n  # one output per token
    assert whole["outputs"] == 2  # the first token, then the rest at the end
    assert whole["tokens"] == streamed["tokens"] and whole["versions"] == streamed["versions"] == [0] * n
    assert whole["logprobs"] == pytest.approx(streamed["logprobs"], abs=1e-4)
    for g in (streamed, whole):
        assert 0 < g["queue_s"] < g["total_s"]
