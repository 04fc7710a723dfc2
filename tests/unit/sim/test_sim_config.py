"""Simulation configs and `rose sim`: bad input names what is wrong; the command writes its table,
plots and one JSON line."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rose.cli import main
from rose.errors import ConfigError
from rose.sim import SimConfig, load_matrix


def write(tmp_path, text: str) -> str:
    p = tmp_path / "sim.toml"
    p.write_text(text)
    return str(p)


def test_matrix_expands_every_combination_over_the_base(tmp_path):
    path = write(tmp_path, """
[base]
name = "m"
steps = 3
[matrix]
model = ["8b", "32b"]
inter_gbit = [200, 20]
[[config]]
prompts = 64
[[config]]
name = "big"
prompts = 512
[config.matrix]
inter_gbit = [10]
steps = [4, 5]
""")
    cfgs = load_matrix(path)
    assert len(cfgs) == 4 + 4
    assert {c.prompts for c in cfgs} == {64, 512}
    assert {c.inter_gbit for c in cfgs} == {200.0, 20.0, 10.0} and all(isinstance(c.inter_gbit, float) for c in cfgs)
    assert "m[model=8b-inter_gbit=200]" in {c.name for c in cfgs}
    big = [c for c in cfgs if c.name.startswith("big[")]
    assert {(c.inter_gbit, c.steps) for c in big} == {(10.0, 4), (10.0, 5)}  # its own matrix wins
    assert "big[model=32b-inter_gbit=10-steps=5]" in {c.name for c in big}


@pytest.mark.parametrize("text, match", [
    ("[base]\nstepz = 3\n", r"unknown field\(s\) \['stepz'\]"),
    ("[base]\nsteps = 'three'\n", "steps='three' should be int"),
    ("[base]\nsteps = 0\n", r"SimConfig.steps=0 is not allowed"),
    ("[base]\npolicies = ['rose', 'magic']\n", "SimConfig.policies"),
    ("[matrix]\nmodel = '8b'\n", r"\[matrix\] model must be a non-empty list"),
    ("[bases]\nsteps = 3\n", r"unknown table\(s\) \['bases'\]"),
    ("[base\n", "not valid TOML"),
    ("[[config]]\nmatrix = {steps = 3}\n", "config #1's matrix must map fields to non-empty lists"),
    ("[base]\ntrain_fractions = [0.5, 1.5]\n", r"train_fraction\(s\)=1.5"),
])
def test_bad_configs_name_the_field_and_value(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_matrix(write(tmp_path, text))


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no simulation config"):
        load_matrix(str(tmp_path / "nope.toml"))


def test_turns_and_fractions_are_checked_on_construction():
    with pytest.raises(ConfigError, match="turns_max=1"):
        SimConfig(turns_min=2, turns_max=1)
    with pytest.raises(ConfigError, match="trace='weekly'"):
        SimConfig(trace="weekly")


def test_rose_sim_prints_tables_writes_plots_and_a_json_line(tmp_path):
    path = write(tmp_path, """
[base]
name = "cli"
steps = 3
prompts = 48
group_size = 8
job_gpus = 8
serving_gpus = 8
max_num_seqs = 64
[matrix]
algorithm = ["grpo", "dapo"]
""")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sim", path, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    head = json.loads(lines[-1])
    assert head["configs"] == 2 and head["slo_violations"] == 0
    assert head["speedup_vs_fixed_min"] is not None
    assert "== cli[algorithm=dapo]" in res.output and "fixed_sync" in res.output
    for name in ("results.jsonl", "throughput_vs_scale.png", "rollout_time.png", "slo_attainment.png",
                 "gpu_hours.png"):
        assert (out / name).stat().st_size > 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {r["config"] for r in rows} == {"cli[algorithm=grpo]", "cli[algorithm=dapo]"}


def test_rose_sim_reports_a_bad_config_without_a_traceback(tmp_path):
    res = CliRunner().invoke(main, ["sim", write(tmp_path, "[base]\nstepz = 1\n")])
    assert res.exit_code != 0
    assert "unknown field(s) ['stepz']" in res.output and "Traceback" not in res.output
