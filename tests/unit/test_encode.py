"""The rollout's observation encoding and action decoding ask a fast tokenizer's Rust tokenizer
directly; the ids and the text must be exactly what the tokenizer's own calls give, special-token
text and unknown words included."""
import random

from rose.envs.calc import CalcEnv
from rose.envs.guess import GuessEnv
from rose.models.tiny import BOS, EOS, UNK, build_tokenizer
from rose.models.tokens import decode, encode
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


def test_decode_gives_the_tokenizer_calls_text():
    tok = build_tokenizer(GuessEnv.vocabulary() + CalcEnv.vocabulary())
    assert tok.is_fast and tok.clean_up_tokenization_spaces is False  # the direct path is the one tested
    rng = random.Random(1)
    seqs = [[], [tok.bos_token_id], [tok.eos_token_id, tok.unk_token_id]]
    seqs += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 12))] for _ in range(200)]
    for ids in seqs:
        assert decode(tok, ids) == tok.decode(ids, skip_special_tokens=True), ids
    words = WordTokenizer(["find", "higher"])  # not a fast tokenizer: called as usual
    assert decode(words, [5, 6, 4]) == words.decode([5, 6, 4], skip_special_tokens=True)
