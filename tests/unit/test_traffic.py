"""Serving traffic schedules."""
import os

import pytest

from rose.errors import ConfigError
from rose.runtime.coserve.traffic import Burst, azure_trace, synthetic

TRACE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "data", "azure_llm_inference_2023_conv.csv")


def test_synthetic_is_seeded_sorted_and_bursty():
    a = synthetic(5.0, 200.0, burst=Burst(every_s=20, length_s=5, factor=4), seed=3)
    assert a == synthetic(5.0, 200.0, burst=Burst(every_s=20, length_s=5, factor=4), seed=3)
    assert all(x.t <= y.t for x, y in zip(a, a[1:])) and all(0 <= x.t < 200 for x in a)
    in_burst = sum(1 for x in a if x.t % 20 < 5) / (200 * 5 / 20)
    outside = sum(1 for x in a if x.t % 20 >= 5) / (200 * 15 / 20)
    assert 3 < in_burst / outside < 5.5  # about the factor
    assert 3.5 < outside < 6.5  # about the base rate


def test_synthetic_rejects_nonsense():
    with pytest.raises(ConfigError, match="rate"):
        synthetic(0, 10)
    with pytest.raises(ConfigError, match="burst"):
        Burst(every_s=5, length_s=10)


def test_azure_trace_is_scaled_and_clipped():
    a = azure_trace(TRACE, time_scale=0.5, token_scale=0.1, max_prompt=48, max_gen=16, duration_s=60)
    assert a and a[0].t == 0 and all(x.t < 60 for x in a)
    assert all(1 <= x.prompt_tokens <= 48 and 1 <= x.max_tokens <= 16 for x in a)
    full = azure_trace(TRACE, duration_s=120)
    assert len(a) == pytest.approx(len(full), rel=0.35)  # 60 s at half the gaps ~ 120 s of trace


def test_azure_trace_names_a_bad_file(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="missing columns"):
        azure_trace(str(p))
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,x,3\n")
    with pytest.raises(ConfigError, match=":2: bad row"):
        azure_trace(str(p))
