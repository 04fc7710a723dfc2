"""Environments for multi-turn rollouts: the `Env` contract and the built-in `guess` and `calc`."""
from rose.envs.base import Env, StepResult, env_class, make_env, register, replay

__all__ = ["Env", "StepResult", "env_class", "make_env", "register", "replay"]
