"""Turn formats (rose/models/turns.py): a chat tokenizer's conversation is built by appending ids turn by
turn, and the result is exactly the chat template's rendering of the same conversation; the agent
loop, the provenance replay and the warm start agree on it."""
import asyncio
import random
from concurrent.futures import Future

import pyarrow as pa
import pytest

from rose.envs import env_class
from rose.envs.provenance import check_provenance
from rose.models.tokens import encode
from rose.models.turns import ChatTemplateError, ChatTurns, PlainTurns, turn_format
from rose.models.bpe import CHAT_TEMPLATE, build_bpe_tokenizer, demonstration_corpus
from rose.models.tiny import build_tokenizer
from rose.models.warmstart import encode_demo
from rose.ops.rollout import RolloutSpec, agent_loop
from rose.runtime.engine.base import Generation
from rose.runtime.trajectory import to_batch


@pytest.fixture(scope="module")
def bpe():
    return build_bpe_tokenizer(demonstration_corpus(env_class("guess"), episodes=300), 400)


def chat_of(segments):
    """A demonstration as chat messages (the environment speaks as the user)."""
    return [{"role": "assistant" if policy else "user", "content": text.rstrip("\n") if policy else text}
            for text, policy in segments]


@pytest.mark.parametrize("env", ["guess", "calc"])
def test_turn_by_turn_ids_are_the_templates_rendering(env):
    cls = env_class(env)
    tok = build_bpe_tokenizer(demonstration_corpus(cls, episodes=300), 400)
    assert isinstance(turn_format(tok), ChatTurns) and turn_format(tok) is turn_format(tok)
    rng = random.Random(5)
    for _ in range(20):
        segments = cls.demonstration(rng)
        ids, mask = encode_demo(tok, segments)
        rendered = tok.apply_chat_template(chat_of(segments), tokenize=False)
        assert tok.decode(ids) == rendered
        assert ids == encode(tok, rendered)  # appending ids gave what encoding the whole text gives
        policy = [i for i, m in zip(ids, mask) if m]
        eot = turn_format(tok).eot_id
        assert policy.count(eot) == sum(p for _, p in segments)  # each policy turn learns to end itself


def test_plain_tokenizers_keep_plain_turns():
    tok = build_tokenizer(env_class("guess").vocabulary())
    fmt = turn_format(tok)
    assert isinstance(fmt, PlainTurns)
    assert fmt.stop_ids == (tok.convert_tokens_to_ids("\n"), tok.eos_token_id)
    assert fmt.prompt("find 1 16\n")[0] == tok.bos_token_id


def test_a_cut_turn_is_closed_and_an_ended_one_is_not_reopened(bpe):
    fmt = turn_format(bpe)
    cut = fmt.after(encode(bpe, "guess"), "higher\n", done=False)
    assert cut[0] == fmt.eot_id
    assert bpe.decode(cut) == "<|im_end|>\n<|im_start|>user\nhigher\n<|im_end|>\n<|im_start|>assistant\n"
    closed = fmt.after(encode(bpe, "guess 3") + [fmt.eot_id], "correct\n", done=True)
    assert bpe.decode(closed) == "\n<|im_start|>user\ncorrect\n<|im_end|>\n"
    assert fmt.after(encode(bpe, "guess 3") + [fmt.eot_id], "", done=True) == []


def test_a_template_that_rewrites_history_is_refused(bpe):
    # Drops earlier assistant turns' content once another message follows (as templates that strip
    # reasoning do): appending ids turn by turn would not match what the template renders.
    dropped = "('' if message['role'] == 'assistant' and not loop.last else message['content'])"
    rewriting = CHAT_TEMPLATE.replace("message['content']", dropped)
    tok = build_bpe_tokenizer(demonstration_corpus(env_class("guess"), episodes=50), 300)
    tok.chat_template = rewriting
    with pytest.raises(ChatTemplateError, match="renders earlier turns differently"):
        turn_format(tok)


class ChatPolicy:
    """A rollout engine whose turns are given as text; a turn ends with the end-of-turn token unless
    its text ends with "~" (then it is cut there, as at max_action_tokens)."""

    def __init__(self, tok, actions):
        self.tok, self.actions, self.eot = tok, actions, turn_format(tok).eot_id

    def generate(self, prompt, sampling, request_id):
        assert self.eot in sampling.stop_token_ids
        tid, _, turn = request_id.rpartition("-t")
        text = self.actions[tid][int(turn)]
        ids = encode(self.tok, text.rstrip("~")) + ([] if text.endswith("~") else [self.eot])
        fut = Future()
        fut.set_result(Generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop"))
        return fut


def test_chat_rollouts_replay_and_a_changed_markup_token_is_caught(bpe):
    target = random.Random(7).randint(1, 16)
    wrong = 1 if target != 1 else 2
    episodes = {"a": [f"guess {wrong}", f"guess {target}"], "b": [f"guess {wrong}~", f"guess {target}"]}
    specs = [RolloutSpec(step=0, group_id=g, sample_id=0, env="guess", env_seed=7) for g in range(2)]
    policy = ChatPolicy(bpe, {s.trajectory_id: acts for s, acts in zip(specs, episodes.values())})

    async def run():
        return [await agent_loop(s, env_class("guess")(), policy, bpe, 256, "tcp://w:1") for s in specs]

    trajs = asyncio.run(run())
    assert [t.finish_reason for t in trajs] == ["done", "done"]
    assert [t.actions for t in trajs] == [[f"guess {wrong}", f"guess {target}"]] * 2
    table = pa.Table.from_batches([to_batch(trajs)])
    assert check_provenance(table, bpe) == []
    # The cut turn got its end-of-turn token as context: both rows read as the same chat.
    assert bpe.decode(trajs[0].token_ids) == bpe.decode(trajs[1].token_ids)
    ids = list(trajs[0].token_ids)
    k = ids.index(turn_format(bpe).eot_id)
    ids[k + 2] = bpe.convert_tokens_to_ids("<|im_end|>")  # a markup token after the first turn, changed
    bad = table.set_column(table.schema.get_field_index("token_ids"), "token_ids",
                           pa.array([ids, list(trajs[1].token_ids)], table.schema.field("token_ids").type))
    assert [tid for tid, _ in check_provenance(bad, bpe)] == [trajs[0].trajectory_id]
