"""Inference engines behind one protocol: the vLLM adapter, the loop that steps it, a fake for unit tests."""
from rose.runtime.engine.base import Engine, EngineOutput, SamplingSpec
from rose.runtime.engine.loop import EngineLoop, Generation

__all__ = ["Engine", "EngineLoop", "EngineOutput", "Generation", "SamplingSpec"]
