"""A tiny Qwen2-architecture model with a byte-level BPE tokenizer and a ChatML chat template, built
locally (`ModelConfig(tokenizer="bpe")`).

The word-level tiny models (`rose.models.tiny`) keep the default pipelines small and fast; this one
has the shape of a real instruct model: a byte-level BPE vocabulary trained here on the environment's
own demonstrations (every byte is a token, so any text encodes), the `<|im_start|>` / `<|im_end|>`
chat markup of Qwen2-family models, grouped-query attention with q/k/v biases. Rollouts then take the
chat path (`rose.models.turns.ChatTurns`), as they do for a user's Qwen2 or Llama 3 directory.
"""
from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rose.config import ModelConfig
from rose.models.tiny import model_sizes

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen2-family instruct models write it (without their default system message: contexts here
# are a hundred tokens).
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
CORPUS_EPISODES = 2000  # demonstrations the BPE merges are learnt from


def demonstration_corpus(env_cls, episodes: int = CORPUS_EPISODES, seed: int = 0) -> list[str]:
    """Text of `episodes` demonstrations of `env_cls` (both sides, each turn under its chat role's name),
    and its vocabulary: what the merges are learnt from."""
    rng = random.Random(seed)
    texts = ["".join(f"{'assistant' if policy else 'user'}\n{text}" for text, policy in env_cls.demonstration(rng))
             for _ in range(episodes)]
    return texts + [" ".join(env_cls.vocabulary())]


def build_bpe_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of at most `vocab_size` entries (specials included) learnt on `corpus`
    (fewer where the corpus has no more pairs worth merging)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    # As Qwen2 instruct models: no BOS, generation ends at <|im_end|>, batches pad with <|endoftext|>.
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=END_OF_TEXT,
                                   chat_template=CHAT_TEMPLATE)


def build_qwen2(cfg: ModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM with random weights sized by `cfg` (half as many key/value heads as query heads
    where that divides)."""
    kv_heads = cfg.num_heads // 2 if cfg.num_heads % 2 == 0 else cfg.num_heads
    qwen = Qwen2Config(**model_sizes(cfg, tokenizer), num_key_value_heads=kv_heads, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(qwen)
