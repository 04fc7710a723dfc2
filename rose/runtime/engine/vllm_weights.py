"""Weight reloads of a `VllmEngine` in slices, for an engine thread that must not stop for a whole reload.

The functions here run on vLLM's worker (in this process) through `collective_rpc`.
"""
from __future__ import annotations

import time


def param_dtypes(worker):
    # Through collective_rpc: the dtypes of the model's parameters.
    return {p.dtype for p in worker.model_runner.get_model().parameters()}


def _rpc_reload(worker, items):
    # vLLM's in-place reload (`reload_weights`), cut in three so that its middle can run in slices:
    # "begin" parks every layer's tensors and wraps its weight loaders, each slice's tensors are
    # buffered per layer, and a layer is processed (the CPU backend repacks its linear kernels) and
    # copied back as soon as it holds all of its tensors; "end" processes what is left (attention).
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import layerwise

    runner = worker.model_runner
    model = runner.get_model()
    with set_current_vllm_config(runner.vllm_config):
        if items == "begin":
            # A layer with no parameters and only non-persistent buffers holds nothing a checkpoint has:
            # derived values such as RoPE's cos/sin cache, and vLLM shares such a layer between models
            # of one shape (`get_rope` caches them). "begin" parks every layer on the meta device until
            # "end"; a shared one parked there broke the serving model's steps between slices (seen).
            # Put those back at once, as "end" would have.
            derived = [m for m in model.modules() if not m._parameters and m._buffers
                       and set(m._buffers) <= m._non_persistent_buffers_set]
            layerwise.initialize_layerwise_reload(model)
            for m in derived:
                info = layerwise.get_layerwise_info(m)
                if info.can_load():
                    layerwise._place_kernel_tensors(m, info)
                    info.reset()
        elif items == "end":
            layerwise.finalize_layerwise_reload(model, runner.vllm_config.model_config)
            runner.reset_lora_state()
            runner.reset_encoder_cache()
            runner.reset_mm_cache()
        else:
            model.load_weights(iter(items))


class StagedLoad:
    """A weight reload applied in slices between engine iterations, each slice within a time budget.

    Why: a whole reload of a 101 M-parameter model took 150-370 ms here, longer than a serving TPOT
    budget, and on a co-serving device it ran where serving requests wait. Staged (cast to the
    engine's dtype, grouped by layer) off the engine's thread, it is then applied a few tensors at a
    time, each slice inside what the serving iteration leaves. Until the last slice the model is
    half old, half new (and its unfinished layers sit on the meta device): the owner must not step
    the engine in between, so no request ever sees a mix of versions.
    """

    def __init__(self, engine, named_tensors: dict, version: int):
        self.engine = engine
        self.version = version
        dtype = engine.param_dtype
        # Sorted by name, a layer's tensors come together: vLLM processes each layer once it is whole,
        # so few layers are ever buffered at once. "begin" and "end" are the reload's own steps.
        self._steps: list = ["begin"] + [[(k, v.to(dtype) if dtype and v.is_floating_point() else v)]
                                         for k, v in sorted(named_tensors.items())] + ["end"]
        self._next = 0  # steps applied
        self.slices = 0  # `advance` calls that applied something

    @property
    def done(self) -> bool:
        return self._next == len(self._steps)

    def advance(self, budget_ms: float) -> bool:
        """Apply steps for about `budget_ms` (at least one step); True once the engine holds the version."""
        if self._next == 0:
            self.engine.check_idle(self.version)
        t0 = time.perf_counter()
        self.slices += 1
        while not self.done:
            t = time.perf_counter()
            self.engine.rpc(_rpc_reload, self._steps[self._next])
            self._next += 1
            now = time.perf_counter()
            # The longest single step seen on this engine (ms), kept across loads: a slice stops
            # before the next step could overrun its budget.
            self.engine.slowest_reload_step_ms = max(self.engine.slowest_reload_step_ms, (now - t) * 1e3)
            if (now - t0) * 1e3 + self.engine.slowest_reload_step_ms > budget_ms:
                break
        if self.done:
            self.engine.commit_version(self.version)
        return self.done


