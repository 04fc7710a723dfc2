"""`TrainerHost`: what the trainer worker holds: the policy model and its optimizer
(`rose.runtime.trainer.Trainer`), built anew for every run."""
from __future__ import annotations

from rose.runtime.protocol import ModelSpec
from rose.runtime.worker.host import Host


class TrainerHost(Host):
    def __init__(self, address: str, weights, cores: tuple[int, ...] | None = None):
        super().__init__(address, weights, cores)
        self.trainer = None  # rose.runtime.trainer.Trainer of the run, once prepared

    def prepare(self, spec: ModelSpec) -> None:
        """A new trainer, so that no optimizer state leaks between runs; its weights are published as
        version 0."""
        import torch

        from rose.runtime.trainer import Trainer

        torch.set_num_threads(max(1, len(self.cores) if self.cores else 1))
        self.trainer = Trainer(spec.model_dir, seed=spec.seed, temperature=spec.engine.temperature)
        self.weights.reset(spec.engine.dtype)
        self.weights.publish(self.trainer.model.state_dict(), 0)
        # Engines load version 0 from the checkpoint, no sync reads it: version 1 may follow at once.
        self.weights.mark_synced(0)
        self.spec = spec
