"""The RL step's operators (prompts, rollout, reward, train, sync); importing this package registers them.

`rose/__init__.py` imports it, so the ops are registered wherever ROSE is imported.
"""
from rose.ops import steps  # noqa: F401  (registers the built-in ops)
