"""Pure-logic tests of the engine loop and the agent loop, on the FakeEngine."""
import asyncio

import pytest

from rose.errors import EngineError, PromptTooLongError
from rose.ops.rollout import RolloutSpec, agent_loop
from rose.runtime.engine import EngineLoop, SamplingSpec
from rose.runtime.engine.fake import FakeEngine
from tests.helpers.envs import LongPromptEnv, RaisingEnv, ScriptedEnv


class WordTokenizer:
    """Just enough tokenizer for the agent loop: words <-> ids."""

    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(["[PAD]", "[BOS]", "[EOS]", "[UNK]", "\n", *words])}
        self.inv = {i: w for w, i in self.vocab.items()}
        self.bos_token_id, self.eos_token_id, self.unk_token_id = 1, 2, 3

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.vocab.get(w, 3) for w in text.replace("\n", " \n ").split(" ") if w]}

    def convert_tokens_to_ids(self, tok):
        return self.vocab.get(tok, 3)

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.inv[i] for i in ids if not (skip_special_tokens and i < 4))


@pytest.fixture
def loop_and_tok():
    tok = WordTokenizer(["start", "obs", "ok", "guess", "find", "higher", "lower", "correct"] +
                        [str(i) for i in range(20)])
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    engine = FakeEngine(vocab_size=len(tok.vocab), max_model_len=64, script={"": [ok, nl, ok, nl]})
    loop = EngineLoop(engine)
    yield loop, tok
    loop.close()


def test_requests_meet_in_one_batch(loop_and_tok):
    loop, _ = loop_and_tok
    futs = [loop.generate([1, 5], SamplingSpec(max_tokens=3)) for _ in range(16)]
    gens = [f.result(timeout=5) for f in futs]
    assert all(len(g.token_ids) == 3 and g.finish_reason == "length" for g in gens)
    assert loop.iterations < 16 * 3  # batched, not one request at a time


def test_bad_request_fails_alone_and_the_loop_keeps_serving(loop_and_tok):
    loop, _ = loop_and_tok
    bad = loop.generate([1] * 100, SamplingSpec(max_tokens=2))
    good = loop.generate([1, 2], SamplingSpec(max_tokens=2))
    with pytest.raises(PromptTooLongError):
        bad.result(timeout=5)
    assert len(good.result(timeout=5).token_ids) == 2


def test_weight_versions_stamp_tokens(loop_and_tok):
    loop, _ = loop_and_tok
    assert loop.load_weights({}, 7).result(timeout=5) == 7
    g = loop.generate([1], SamplingSpec(max_tokens=2)).result(timeout=5)
    assert g.weight_versions == [7, 7]


def test_weight_load_waits_for_requests_in_flight_and_later_requests_wait_for_it(loop_and_tok):
    loop, _ = loop_and_tok
    before = loop.generate([1], SamplingSpec(max_tokens=30))
    load = loop.load_weights({}, 9)
    after = loop.generate([1], SamplingSpec(max_tokens=3))
    g0, g1 = before.result(timeout=5), after.result(timeout=5)
    assert load.result(timeout=5) == 9
    assert set(g0.weight_versions) == {0} and len(g0.token_ids) == 30  # one version throughout
    assert set(g1.weight_versions) == {9}


def test_agent_loop_masks_environment_tokens(loop_and_tok):
    loop, tok = loop_and_tok
    spec = RolloutSpec(step=3, group_id=1, sample_id=2, env="scripted", env_seed=5)
    traj = asyncio.run(agent_loop(spec, ScriptedEnv(turns=2), loop, tok, max_model_len=64))
    assert traj.trajectory_id == "s3-g1-i2"
    assert traj.finish_reason == "done" and traj.error is None
    assert traj.env_reward == 2.0 and len(traj.turn_offsets) == 2
    gen = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    assert gen == [tok.vocab["ok"], tok.vocab["\n"]] * 2  # only the policy's tokens are trained on
    text = tok.decode([t for t, m in zip(traj.token_ids, traj.loss_mask) if not m])
    assert "start 5" in text and "obs 1" in text and "obs 2" in text
    assert all(v == -1 for v, m in zip(traj.weight_versions, traj.loss_mask) if not m)


def test_environment_exception_is_recorded_not_raised(loop_and_tok):
    loop, tok = loop_and_tok
    spec = RolloutSpec(0, 0, 0, "raising", env_seed=1)
    traj = asyncio.run(agent_loop(spec, RaisingEnv(), loop, tok, max_model_len=64))
    assert traj.finish_reason == "failed"
    assert "environment exploded on purpose" in traj.error


def test_prompt_too_long_is_a_clear_per_trajectory_error(loop_and_tok):
    loop, tok = loop_and_tok
    traj = asyncio.run(agent_loop(RolloutSpec(0, 0, 7, "long", env_seed=1), LongPromptEnv(), loop, tok,
                                  max_model_len=64))
    assert traj.finish_reason == "failed"
    assert "does not fit the model's context" in traj.error and "max_model_len=64" in traj.error
    # the engine still serves the next trajectory
    ok = asyncio.run(agent_loop(RolloutSpec(0, 0, 8, "scripted", env_seed=1), ScriptedEnv(), loop, tok,
                                max_model_len=64))
    assert ok.finish_reason == "done"


def test_an_engine_error_fails_that_request_only():
    from rose.errors import EngineError
    from rose.runtime.engine.base import EngineOutput

    class FlakyEngine(FakeEngine):
        def step(self):
            outs = super().step()
            return [EngineOutput(o.request_id, [], [], True, "abort", error="log-probs missing")
                    if o.request_id.startswith("bad") else o for o in outs]

    loop = EngineLoop(FlakyEngine(vocab_size=16, max_model_len=32))
    try:
        bad = loop.generate([1], SamplingSpec(max_tokens=2), request_id="bad")
        good = loop.generate([1], SamplingSpec(max_tokens=2), request_id="good")
        with pytest.raises(EngineError, match="log-probs missing"):
            bad.result(timeout=5)
        assert len(good.result(timeout=5).token_ids) == 2
    finally:
        loop.close()


class FailingLoadEngine(FakeEngine):
    def load_weights(self, named_tensors, version):
        raise RuntimeError("weight shape mismatch")


def test_a_weight_load_that_fails_fails_every_later_request_and_load():
    """A failed load may leave the model half swapped (RELIABILITY.md): nothing may step it again."""
    loop = EngineLoop(FailingLoadEngine())
    try:
        assert loop.generate([1], SamplingSpec(max_tokens=2)).result(timeout=5).weight_versions == [0, 0]
        stepped = loop.iterations
        with pytest.raises(RuntimeError, match="weight shape mismatch"):
            loop.load_weights({}, 3).result(timeout=5)
        with pytest.raises(EngineError, match="unusable: its weight load to version 3 failed"):
            loop.generate([1], SamplingSpec(max_tokens=2)).result(timeout=5)
        with pytest.raises(EngineError, match="unusable"):
            loop.load_weights({}, 4).result(timeout=5)
        assert loop.broken and loop.iterations == stepped  # the engine never stepped again
    finally:
        loop.close()
