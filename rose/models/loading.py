"""Resolve a pipeline's model to a directory that vLLM and transformers both load.

A user's directory is checked up front (exists, has a config, is a causal LM, has a tokenizer) so
that a bad path fails at start with a clear error, not inside a worker minutes later.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from rose.config import ModelConfig
from rose.errors import ModelError

_COMPLETE = ".rose-complete"


def check_model_dir(path: str) -> None:
    """Raise ModelError unless `path` holds a Hugging Face causal LM with a tokenizer."""
    if not os.path.isdir(path):
        raise ModelError(f"model directory {path!r} does not exist", path=path)
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise ModelError(f"{path!r} has no config.json; expected a Hugging Face model directory", path=path)
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        cfg = AutoConfig.from_pretrained(path)
    except Exception as e:  # unreadable or unknown model type
        raise ModelError(f"cannot read the model config in {path!r}: {e}", path=path) from None
    archs = getattr(cfg, "architectures", None) or []
    # The checkpoint's own architectures decide when present (a BERT encoder has a causal-LM head class
    # in transformers, but a BertModel checkpoint is not one); the model type decides otherwise.
    if archs:
        causal = any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in archs)
    else:
        causal = cfg.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if not causal:
        raise ModelError(f"{path!r} is not a causal language model (model_type={cfg.model_type!r}, "
                         f"architectures={archs})", path=path)
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer.model")):
        raise ModelError(f"{path!r} has no tokenizer (tokenizer.json or tokenizer.model)", path=path)
    if not any(f.endswith((".safetensors", ".bin")) for f in os.listdir(path)):
        raise ModelError(f"{path!r} has no weights (*.safetensors or *.bin)", path=path)


def prepare_model(cfg: ModelConfig, env_cls: type, seed: int = 0, progress: bool = True) -> str:
    """Return a model directory for this pipeline: the user's (checked) or the cached tiny one, built
    for and warm-started on the environment class `env_cls` (`rose.envs.env_class(name)`)."""
    if cfg.path is not None:
        check_model_dir(cfg.path)
        return os.path.abspath(cfg.path)
    env_name = env_cls.name
    key = json.dumps({"env": env_name, "vocab": env_cls.vocabulary(), "hidden": cfg.hidden_size,
                      "layers": cfg.num_layers, "heads": cfg.num_heads, "len": cfg.max_model_len,
                      "steps": cfg.warmstart_steps, "batch": cfg.warmstart_batch, "lr": cfg.warmstart_lr,
                      "seed": seed, "format": 1}
                     | ({"tokenizer": "bpe", "bpe_vocab": cfg.bpe_vocab_size} if cfg.tokenizer == "bpe" else {}),
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    out = os.path.join(cfg.cache_dir, "models", f"{env_name}-{digest}")
    if os.path.isfile(os.path.join(out, _COMPLETE)):
        return out
    from rose.models.warmstart import warm_start

    if cfg.tokenizer == "bpe":
        from rose.models.bpe import build_bpe_tokenizer, build_qwen2, demonstration_corpus

        tok = build_bpe_tokenizer(demonstration_corpus(env_cls, seed=seed), cfg.bpe_vocab_size)
        model = build_qwen2(cfg, tok, seed=seed)
    else:
        from rose.models.tiny import build_model, build_tokenizer

        tok = build_tokenizer(env_cls.vocabulary())
        model = build_model(cfg, tok, seed=seed)
    losses = warm_start(model, tok, env_cls, cfg.warmstart_steps, cfg.warmstart_batch, cfg.warmstart_lr,
                        seed=seed, progress=progress)
    # Write beside the target and rename: a crash mid-write never leaves a half model in the cache.
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{env_name}-", dir=os.path.dirname(out))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "warmstart.json"), "w") as f:
        json.dump({"key": json.loads(key), "final_loss": losses[-1] if losses else None}, f)
    open(os.path.join(tmp, _COMPLETE), "w").close()
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def load_checkpoint(model_dir: str) -> dict:
    """Every tensor of the `*.safetensors` files in `model_dir`, by parameter name (on the CPU)."""
    import glob

    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        tensors.update(load_file(f))
    return tensors
