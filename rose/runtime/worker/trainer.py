"""`TrainerHost`: what the trainer worker holds: the policy model and its optimizer
(`rose.runtime.trainer.Trainer`), built anew for every run."""
from __future__ import annotations

from rose.runtime.protocol import ModelSpec
from rose.runtime.worker.host import Host


class TrainerHost(Host):
    def __init__(self, address: str, weights, cores: tuple[int, ...] | None = None):
        super().__init__(address, weights, cores)
        self.trainer = None  # rose.runtime.trainer.Trainer of the run, once prepared
        self.tokenizer = None  # the policy's, once prepared: the provenance check replays with it

    def prepare(self, spec: ModelSpec) -> None:
        """A new trainer, so that no optimizer state leaks between runs; its weights are published as
        the version it starts from (0, or a checkpoint's)."""
        import torch

        from rose.runtime.trainer import Trainer

        torch.set_num_threads(max(1, len(self.cores) if self.cores else 1))
        self.trainer = Trainer(spec.model_dir, seed=spec.seed, temperature=spec.engine.temperature)
        if spec.weights_dir is not None:  # a resumed run, or a replaced trainer: the checkpoint's state
            self.trainer.restore(spec.weights_dir)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        self.weights.reset(spec.engine.dtype)
        self.weights.publish(self.trainer.model.state_dict(), self.trainer.version)
        # Engines load this version from the model or checkpoint directory, no sync reads it: the next
        # version may follow at once.
        self.weights.mark_synced(self.trainer.version)
        self.spec = spec
