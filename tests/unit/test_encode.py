"""The rollout's observation encoding asks a fast tokenizer's Rust tokenizer directly; the ids must be
exactly what the tokenizer's own call gives, special-token text and unknown words included."""
import random

from rose.envs.calc import CalcEnv
from rose.envs.guess import GuessEnv
from rose.models.tiny import BOS, EOS, UNK, build_tokenizer
from rose.models.tokens import encode
from tests.unit.test_engine_loop import WordTokenizer


def test_encode_gives_the_tokenizer_calls_ids():
    tok = build_tokenizer(GuessEnv.vocabulary() + CalcEnv.vocabulary())
    assert tok.is_fast
    rng = random.Random(0)
    texts = ["", "find 1 16\n", "higher\n", "correct\n", "  two  spaces\n\n", f"{BOS} {EOS} {UNK} guess 7",
             "never-seen words 1000 -3\n", "ünïcode ☃\n"]
    for env in (GuessEnv, CalcEnv):
        for _ in range(20):
            texts += [text for text, _ in env.demonstration(rng)]
    for text in texts:
        assert encode(tok, text) == (tok(text, add_special_tokens=False)["input_ids"] if text else []), text
    # Not a fast tokenizer: called as usual.
    words = WordTokenizer(["find", "higher"])
    assert encode(words, "find higher\n") == words("find higher\n")["input_ids"]
