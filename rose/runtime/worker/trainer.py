"""`TrainerHost`: what the trainer worker holds: the policy model and its optimizer
(`rose.runtime.trainer.Trainer`), built anew for every run. With trainer peers (`ModelSpec.trainer_peers`),
this worker is rank 0 of a trainer sharded over them (rose/runtime/worker/trainer_group.py)."""
from __future__ import annotations

from rose.runtime.engine.dtype import engine_dtype
from rose.runtime.protocol import ModelSpec
from rose.runtime.worker.host import Host


class TrainerHost(Host):
    def __init__(self, address: str, weights, cores: tuple[int, ...] | None = None):
        super().__init__(address, weights, cores)
        self.trainer = None  # rose.runtime.trainer.Trainer of the run, once prepared
        self.tokenizer = None  # the policy's, once prepared: the provenance check replays with it
        self.peers: tuple[str, ...] = ()  # rank 0: the other ranks' workers, in rank order
        self.publisher = None  # rose.runtime.weights.publisher.RankPublisher of the run: this rank's part

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
            # Engines load this version from the model or checkpoint directory, no sync reads it: the
            # next version may follow at once.
            self.publish()  # a collective with peers
            self.weights.mark_synced(self.trainer.version)
        group.wait_for_peers(futures)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        self.spec = spec

    def build_trainer(self, spec: ModelSpec) -> None:
        """This worker's trainer for the run (its shard, in a process group), from the checkpoint if any,
        and a fresh weight endpoint to publish its versions through."""
        import torch

        from rose.runtime.trainer import Trainer
        from rose.runtime.weights.publisher import RankPublisher

        torch.set_num_threads(max(1, len(self.cores) if self.cores else 1))
        self.weights.reset(engine_dtype(spec.engine), spec.engine.weight_shard_bytes)
        self.publisher = RankPublisher(self.weights.dtype, self.weights.shard_bytes)
        self.trainer = Trainer(spec.model_dir, seed=spec.seed, temperature=spec.engine.temperature)
        if spec.weights_dir is not None:  # a resumed run, or a replaced trainer: the checkpoint's state
            self.trainer.restore(spec.weights_dir)

    def publish(self) -> None:
        """Publish the trainer's version: this rank's shards into this worker's endpoint (one trainer: all
        of them). Sharded, a collective every rank calls: rank 0 first waits for the sync of the version
        before (peers wait in the collective meanwhile, at most the group timeout), so no rank replaces
        shards a running sync still reads; then rank 0 holds the version's whole manifest and which rank
        serves which shard, and syncs read each shard from its rank."""
        import torch.distributed as dist

        from rose.runtime.weights.plan import Origin
        from rose.runtime.weights.publisher import union

        trainer, weights = self.trainer, self.weights
        if trainer.rank == 0:
            weights.wait_before_publish()
        own, data, encoded = self.publisher.part(trainer.model.state_dict(), trainer.version, weights.store.get)
        whole, origins = None, ()
        if trainer.world > 1:
            held = weights.own.hashes() if weights.own is not None else frozenset()  # its part of the version before
            parts = [None] * trainer.world
            dist.all_gather_object(parts, (own, weights.worker.address, weights.site, frozenset(held)))
            if trainer.rank == 0:
                whole = union([p[0] for p in parts])
                origins = tuple(Origin(address, site, frozenset(part.hashes()) | before)
                                for part, address, site, before in parts)
        weights.hold(own, data, encoded, whole=whole, origins=origins)
