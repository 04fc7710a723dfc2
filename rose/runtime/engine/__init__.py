"""Inference engines behind one protocol: the vLLM adapter, the loop that steps it, a fake for unit tests."""
from rose.runtime.engine.base import Engine, EngineOutput, Generation, RolloutEngine, SamplingSpec
from rose.runtime.engine.loop import EngineLoop

__all__ = ["Engine", "EngineLoop", "EngineOutput", "Generation", "RolloutEngine", "SamplingSpec"]
