import json
import os

import pytest

from rose.config import ModelConfig
from rose.errors import ModelError
from rose.envs import env_class
from rose.models import check_model_dir, prepare_model
from rose.models.tiny import build_model, build_tokenizer
from rose.models.warmstart import encode_demo


def test_missing_directory(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        check_model_dir(str(tmp_path / "nope"))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        check_model_dir(str(tmp_path))


def test_not_a_causal_lm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ModelError, match="not a causal language model"):
        check_model_dir(str(tmp_path))


def test_tokenizer_round_trip_and_demo_masks():
    cls = env_class("guess")
    tok = build_tokenizer(cls.vocabulary())
    ids = tok("guess 7\nhigher\n", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.unk_token_id not in ids
    assert tok.decode(ids).split() == ["guess", "7", "higher"]
    demo_ids, mask = encode_demo(tok, [("find 1 16\n", False), ("guess 3\n", True), ("higher\n", False)])
    assert demo_ids[0] == tok.bos_token_id
    assert [i for i, m in zip(demo_ids, mask) if m] == tok("guess 3\n", add_special_tokens=False)["input_ids"]


def test_tiny_model_is_a_loadable_causal_lm(tmp_path):
    cfg = ModelConfig(warmstart_steps=0, cache_dir=str(tmp_path))
    path = prepare_model(cfg, env_class("guess"), progress=False)
    check_model_dir(path)  # what we build passes our own check
    assert prepare_model(cfg, env_class("guess"), progress=False) == path  # cached
    model = build_model(cfg, build_tokenizer(env_class("guess").vocabulary()))
    assert model.config.head_dim >= 32 and model.config.vocab_size % 32 == 0
    assert os.path.isfile(os.path.join(path, ".rose-complete"))
