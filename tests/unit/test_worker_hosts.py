"""The worker plugin and its hosts without a cluster: a stand-in Dask worker, the FakeEngine in place of
vLLM, a stand-in Trainer."""
import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from rose.config import EngineConfig
from rose.errors import ConfigError
from rose.runtime.engine import EngineLoop
from rose.runtime.engine.fake import FakeEngine
from rose.runtime.protocol import PLUGIN_NAME, TOPIC, Annotation, ModelSpec, WorkerReport
from rose.runtime.weights.endpoint import WeightEndpoint
from rose.runtime.weights.shards import shard_params
from rose.runtime.worker.plugin import RoseWorker
from rose.runtime.worker.rollout import RolloutHost
from rose.runtime.worker.trainer import TrainerHost


class StandInWorker:
    """As much of a Dask worker as the plugin touches."""

    def __init__(self, address="tcp://w:1"):
        self.address = address
        self.handlers, self.stream_handlers, self.metrics, self.periodic_callbacks = {}, {}, {}, {}
        self.events: list[tuple[str, dict]] = []

    def log_event(self, topic, msg):
        self.events.append((topic, msg))


def _params(v: float) -> dict:
    return {"w": torch.full((64,), v), "b": torch.zeros(8) + v}


@pytest.fixture
def spec(tmp_path):
    save_file(_params(0.0), str(tmp_path / "model.safetensors"))
    return ModelSpec(str(tmp_path), 64, EngineConfig(dtype="float32", max_num_seqs=8))


def test_a_dedicated_worker_prepares_reports_commits_and_sheds(spec, monkeypatch, tmp_path):
    built = []

    def build(host, s):
        built.append(s)
        return EngineLoop(FakeEngine()), "tokenizer"

    monkeypatch.setattr(RolloutHost, "_build", build)

    async def main():
        worker = StandInWorker()
        plugin = RoseWorker("dedicated", site="b")
        await plugin.setup(worker)
        try:
            first = worker.metrics[PLUGIN_NAME](worker)  # what registration carries
            assert first == WorkerReport(worker.address, "dedicated", "b").to_msg()
            # A host caught mid-change still says who it is: Dask would drop a metric that raises.
            monkeypatch.setattr(plugin.host, "report", lambda: 1 / 0)
            assert worker.metrics[PLUGIN_NAME](worker) == first
            monkeypatch.undo()
            monkeypatch.setattr(RolloutHost, "_build", build)

            report = plugin.prepare(spec)
            # Default slots: twice the engine's batch (max_num_seqs 8), so a queue keeps the batch full.
            assert (report.slots, report.weight_version, report.model) == (16, 0, spec.model_dir)
            assert worker.events[-1] == (TOPIC, report.to_msg())
            assert plugin.host.tokenizer == "tokenizer" and plugin.weights.version == 0

            # A sync's commit goes through the endpoint's callback into the engine, then is reported.
            manifest, data = shard_params(_params(1.0), 1, "float32", plugin.weights.shard_bytes)
            for h, b in data.items():
                plugin.weights.store.put(h, b)
            plugin.weights.staged = manifest
            status = await worker.handlers["rose_weights_commit"](version=1)
            assert status["weight_version"] == 1 and plugin.host.engine.weight_version == 1
            assert plugin.weights.version == 1 and worker.events[-1][1]["weight_version"] == 1

            engine = plugin.host.engine
            assert plugin.prepare(spec).weight_version == 0  # same model: the engine is kept, reloaded
            assert plugin.host.engine is engine and len(built) == 1

            # A resumed run (or a replaced trainer): the checkpoint's weights, at its version.
            ckpt = tmp_path / "ckpt"
            ckpt.mkdir()
            save_file(_params(2.0), str(ckpt / "model.safetensors"))
            resumed = replace(spec, weights_dir=str(ckpt), version=4)
            assert plugin.prepare(resumed).weight_version == 4 and plugin.weights.version == 4
            expected, _ = shard_params(_params(2.0), 4, "float32", plugin.weights.shard_bytes)
            assert plugin.weights.manifest.hashes() == expected.hashes() and len(built) == 1

            plugin.set_slot_cap(3)
            assert plugin.report().slots == 3 and worker.events[-1][1]["slots"] == 3
            with pytest.raises(ConfigError, match="slot cap of worker tcp://w:1 must be >= 0"):
                plugin.set_slot_cap(-1)

            worker.stream_handlers["rose-shed"](keys=["k1"])
            assert plugin.should_shed("k1") and not plugin.should_shed(None)
            assert plugin.affinity("k1") == "tcp://w:1"  # shed for room: resume here, where its prefix is
            plugin.rollout_started("k1", 4)
            plugin.rollout_ended("k1")
            assert not plugin.should_shed("k1")
            worker.stream_handlers["rose-shed"](keys=["k2"], migrate=True)
            assert plugin.should_shed("k2") and plugin.affinity("k2") is None  # moving away: resume anywhere
            plugin.rollout_ended("k2")
            assert not plugin.should_shed("k2") and plugin.affinity("k2") == "tcp://w:1"
        finally:
            plugin.teardown(worker)

    asyncio.run(main())


def test_a_dedicated_worker_counts_its_rollout_tasks_on_their_way_to_the_engine():
    """Dask starts a step's rollout tasks on the worker together; until each has handed its group to the
    engine (`rollout_handed`) the host's `arriving` counts it, and the engine's first iteration waits for
    it (rose/runtime/engine/loop.py). Other tasks do not count."""
    plugin = RoseWorker("dedicated")
    tasks = {"g1": SimpleNamespace(annotations={Annotation.ROLE: "rollout"}),
             "g2": SimpleNamespace(annotations={Annotation.ROLE: "rollout"}),
             "reward": SimpleNamespace(annotations=None)}
    plugin.worker = SimpleNamespace(state=SimpleNamespace(tasks=tasks))
    host = plugin.host = plugin._new_host()
    for key in tasks:
        plugin.transition(key, "ready", "executing")
    assert host.arriving() == 2
    plugin.rollout_started("g1", 8)
    assert host.arriving() == 2  # begun, not handed over yet
    plugin.rollout_handed("g1")
    assert host.arriving() == 1
    plugin.transition("g2", "executing", "error")  # failed before it began its group
    assert host.arriving() == 0


def test_a_trainer_publishes_version_0_counted_as_synced(spec, monkeypatch):
    import rose.runtime.trainer

    class StandInTrainer:
        def __init__(self, model_dir, seed=0, temperature=1.0):
            self.model = SimpleNamespace(state_dict=lambda: _params(0.0))
            self.version, self.world, self.rank = 0, 1, 0

    monkeypatch.setattr(rose.runtime.trainer, "Trainer", StandInTrainer)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda path: "the tokenizer")
    threads = torch.get_num_threads()
    ep = WeightEndpoint(StandInWorker("tcp://trainer:1"), "a")
    host = TrainerHost("tcp://trainer:1", ep, cores=(0,))
    try:
        host.prepare(spec)
    finally:
        torch.set_num_threads(threads)
    assert host.report() == {"weight_version": 0, "model": spec.model_dir} and host.slots == 0
    ep.publish(_params(1.0), 1, timeout_s=0.05)  # engines load version 0 themselves: no sync to wait for
    assert ep.version == 1 and host.report()["weight_version"] == 1


def test_bad_worker_settings_name_what_is_wrong():
    with pytest.raises(ConfigError, match="unknown ROSE worker role 'gpu'"):
        RoseWorker("gpu")
    with pytest.raises(ConfigError, match="role 'serving' needs its serving model"):
        RoseWorker("serving")
    with pytest.raises(ConfigError, match="--rose-site must not be empty"):
        RoseWorker("trainer", site="")


class FailsSyncedLoads(FakeEngine):
    def load_weights(self, named_tensors, version):
        if version > 0:  # a synced version, not the run's start
            raise RuntimeError("weight shape mismatch")
        super().load_weights(named_tensors, version)


def test_a_dedicated_worker_whose_weight_load_failed_offers_no_slots(spec, monkeypatch):
    monkeypatch.setattr(RolloutHost, "_build", lambda host, s: (EngineLoop(FailsSyncedLoads()), "tokenizer"))
    host = RolloutHost("tcp://w:1", WeightEndpoint(StandInWorker(), "a"))
    try:
        host.prepare(spec)
        assert host.slots == 16
        with pytest.raises(RuntimeError, match="weight shape mismatch"):
            asyncio.run(host.load_weights({}, 1))
        assert host.slots == 0 and host.report()["weight_version"] == 0
    finally:
        host.close()
