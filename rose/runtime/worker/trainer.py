"""`TrainerHost`: what the trainer worker holds: the policy model and its optimizer
(`rose.runtime.trainer.Trainer`), built anew for every run. With trainer peers (`ModelSpec.trainer_peers`),
this worker is rank 0 of a trainer sharded over them (rose/runtime/worker/trainer_group.py)."""
from __future__ import annotations

from rose.runtime.protocol import ModelSpec
from rose.runtime.worker.host import Host


class TrainerHost(Host):
    def __init__(self, address: str, weights, cores: tuple[int, ...] | None = None):
        super().__init__(address, weights, cores)
        self.trainer = None  # rose.runtime.trainer.Trainer of the run, once prepared
        self.tokenizer = None  # the policy's, once prepared: the provenance check replays with it
        self.peers: tuple[str, ...] = ()  # rank 0: the other ranks' workers, in rank order

    def build_trainer(self, spec: ModelSpec) -> None:
        """This worker's trainer for the run (its shard, in a process group), from the checkpoint if any."""
        import torch

        from rose.runtime.trainer import Trainer

        torch.set_num_threads(max(1, len(self.cores) if self.cores else 1))
        self.trainer = Trainer(spec.model_dir, seed=spec.seed, temperature=spec.engine.temperature)
        if spec.weights_dir is not None:  # a resumed run, or a replaced trainer: the checkpoint's state
            self.trainer.restore(spec.weights_dir)

    def prepare(self, spec: ModelSpec) -> None:
        """A new trainer, so that no optimizer state leaks between runs; its weights are published as
        the version it starts from (0, or a checkpoint's). With peers: forms their process group first
        and builds every rank's shard."""
        from transformers import AutoTokenizer

        from rose.runtime.worker import trainer_group as group

        self.peers = tuple(spec.trainer_peers)
        futures = []
        if self.peers:
            init = group.free_init_method(self.address)
            world = 1 + len(self.peers)
            futures = group.submit_to_peers(self.peers, group.peer_prepare, spec, world, init)
        with group.peer_errors(futures, self.peers):
            if self.peers:
                group.form_group(0, world, init)
            else:
                group.leave_group()  # an earlier run's group, if any: this run trains alone
            self.build_trainer(spec)
            full = self.trainer.full_state_dict()  # a collective with peers
        group.wait_for_peers(futures)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        self.weights.reset(spec.engine.dtype)
        self.weights.publish(full, self.trainer.version)
        # Engines load this version from the model or checkpoint directory, no sync reads it: the next
        # version may follow at once.
        self.weights.mark_synced(self.trainer.version)
        self.spec = spec
