"""Experiment tracking: what is sent, and clear errors for an unknown or missing tracker."""
import importlib.util

import pytest

import rose
from rose.errors import ConfigError
from rose.graph import rl_step
from rose.tracking import Tracking, scalars, settings

PIPELINE = rose.Pipeline(name="p", env="guess",
                         build=lambda s: rl_step("g", "guess", 2, 2, grpo=rose.DAPOConfig(lr=1e-3)))


def test_scalars_are_the_rows_finite_numbers_and_settings_are_flat():
    assert scalars({"step": 3, "reward_mean": 0.5, "failed": 2, "loss": float("nan"), "ok": True, "x": "a"}) == \
        {"reward_mean": 0.5, "failed": 2.0}
    s = settings(PIPELINE)
    assert s["name"] == "p" and s["engine.dtype"] == "auto" and s["train.train.lr"] == "0.001"
    assert s["train.train.algorithm"] == "dapo" and "build" not in s


def test_an_unknown_tracker_is_refused_naming_the_choices(tmp_path):
    choices = r"\('tensorboard', 'mlflow', 'wandb'\)"
    with pytest.raises(ConfigError, match=rf"track='neptune' is not allowed: one of {choices}"):
        Tracking(["neptune"], PIPELINE, str(tmp_path))
    assert Tracking(None, PIPELINE, str(tmp_path)).trackers == []


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_a_tracker_whose_package_is_missing_says_which_to_install(tmp_path):
    with pytest.raises(ConfigError, match="--track wandb needs the wandb package.*pip install wandb"):
        Tracking(["tensorboard", "wandb"], PIPELINE, str(tmp_path))
