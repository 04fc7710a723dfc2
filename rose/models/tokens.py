"""Observation text to token ids and policy ids to action text: how the agent loop encodes what
environments say and decodes what the policy says (on the rollout's hot path), and how a provenance
check replays it."""
from __future__ import annotations


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of an observation, no special tokens. A transformers fast tokenizer is asked through
    its Rust tokenizer directly: the same ids, without the Python wrapper that was a third of a
    rollout worker's event-loop time per turn (py-spy, guess). Other tokenizers are called as usual."""
    if not text:
        return []
    rust = getattr(tokenizer, "_tokenizer", None)
    fast = getattr(tokenizer, "is_fast", False) and not getattr(tokenizer, "split_special_tokens", False)
    if rust is not None and fast:
        return rust.encode(text, add_special_tokens=False).ids
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def decode(tokenizer, ids: list[int]) -> str:
    """The text of a policy turn's ids, special tokens skipped: `tokenizer.decode(ids,
    skip_special_tokens=True)`. A transformers fast tokenizer that does not clean up spaces is asked
    through its Rust tokenizer directly (the same text, without the wrapper's per-call checks: about
    three quarters of the call's time here)."""
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is not None and getattr(tokenizer, "is_fast", False) and \
            getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return rust.decode(ids, skip_special_tokens=True)
    return tokenizer.decode(ids, skip_special_tokens=True)
