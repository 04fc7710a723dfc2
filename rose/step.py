"""One RL step in flight on the cluster: its lowered graph, submitted by phase, and its timings.

The runner (`rose.runner`) creates a `Step` per `start` action and calls `wait`, `submit("train")`,
`wait_trained`, `submit("sync")` and `finish` as the run's schedule (`rose.schedule`) says. Tasks are grouped by the
phase their op declares, so a graph may chain any number of reward nodes; the step's trajectories
are what its train node takes in.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
from distributed import wait

from rose.errors import RunError
from rose.graph import LowerContext, get_op, lower
from rose.graph.lower import Ref
from rose.graph.submit import submit
from rose.ledger import reconcile
from rose.ops.train import train_step
from rose.report import step_row
from rose.runtime.dapo import more_groups, varied_groups
from rose.runtime.protocol import rollout_addresses
from rose.runtime.trajectory import concat, mark_failed

logger = logging.getLogger("rose.run")

# Which phases each part of a step submits.
PARTS = {"gen": ("rollout", "reward"), "train": ("train",), "sync": ("sync",)}


def await_futures(client, futures: list, check, poll_s: float = 0.5) -> None:
    """Wait for `futures` (of `client`), calling `check()` (which may raise, or take futures out of the
    list, which is read again at each look) between looks."""
    # distributed.wait uses the default client; with several clients in one process (a notebook's own,
    # and the one rose.run made) that may be another client, on another event loop.
    with client.as_current():
        while True:
            try:
                wait(futures, timeout=poll_s)
                return
            except TimeoutError:
                check()


def _the(graph, phase: str):
    """The one node of `phase` (validate_step made sure there is one)."""
    (node,) = [n for n in graph.nodes.values() if get_op(n.op).phase == phase]
    return node


class Step:
    def __init__(self, client, fleet, step: int, version: int, graph, lowered, pipeline, ctx: LowerContext):
        self.client, self.fleet, self.step, self.version = client, fleet, step, version
        self.lowered, self.pipeline, self.ctx = lowered, pipeline, ctx
        self.train, self.sync = _the(graph, "train"), _the(graph, "sync")
        self.ids: set[str] = set()  # trajectory ids the step asked for: each rollout node's specs
        self._rollout_keys: list[str] = []
        self._add_rollouts(graph, lowered)
        self.train_inputs = lowered.input_keys(self.train, "trajectories")  # scored partitions it trains on
        self.rounds = 1  # rollout rounds (dynamic sampling adds rounds until enough groups vary)
        cfg = self.train.params.get("grpo")
        self._sampling = cfg if cfg is not None and cfg.samples_dynamically else None  # until its rounds are done
        # Without the placement plugin, rollouts may go to any rollout worker (Dask decides).
        self.roles = dict(fleet.roles)  # as of the poll that began this step
        self.roles["rollout"] = rollout_addresses(self.roles)
        # The run's trainer alone: with a sharded trainer the other trainer workers are its peers, driven
        # by it (rose/runtime/worker/trainer_group.py); a train task elsewhere would train one rank alone.
        self.roles["trainer"] = [fleet.trainer]
        self.futures: dict = {}
        self.submitted_at: dict[str, float] = {}  # part -> perf_counter seconds
        # s from submission (or, started before its weights' sync ended, `start(synced=)`, from that end) to
        # the last rollout done
        self.rollout_s = None
        self.rollouts_done: float | None = None  # when the last rollout was done (perf_counter seconds)
        self._done_at: dict[str, list[float]] = {"rollout": [], "train": [], "sync": []}  # when each future resolved
        # When the sync that brings this step's weights finished, for a step started before it did (filled
        # by that sync's future: `start(synced=...)`); empty otherwise.
        self._weights_at: list[float] = []
        self._metrics: dict | None = None  # the train task's, once gathered (`_train_metrics`)
        self._sync_after = False  # its sync was submitted early, to commit after the next step's rollouts
        self._train_after: list[float] = []  # its train task was submitted early: when the one before it ended

    @classmethod
    def start(cls, pipeline, client, fleet, step: int, version: int, held: int | None = None,
              synced: "Step | None" = None) -> "Step":
        """Build, validate and lower the step's graph on the weights `version`; submit its rollouts and rewards.
        `held`: the version the engines hold now, if not yet `version`: the sync of step `synced` brings
        it, and the placement plugin holds the rollouts until their engine has it."""
        held = version if held is None else held
        fleet.settle(held)  # workers behind what the engines hold catch up; none is behind a sync in flight
        fleet.wait_for_worker(held, pipeline.cluster.worker_wait_s, step)
        graph = pipeline.build(step)
        graph.validate_step()
        ctx = LowerContext(step, version, graph.name, tuple(fleet.ready), pipeline.seed,
                           pipeline.engine.temperature, pipeline.engine.top_p, pipeline.engine.request_timeout_s,
                           pipeline.engine.env_timeout_s)
        st = cls(client, fleet, step, version, graph, lower(graph, ctx), pipeline, ctx)
        if synced is not None:
            st._weights_at = synced._done_at["sync"]  # the list, not the step: no chain of finished steps
        st.submit("gen")
        # When each rollout finished: the rollout phase is timed to the last one, even when the runner
        # looks later (asynchronous mode looks after the train step it overlapped).
        st._time(st._rollout_keys, "rollout")
        return st

    def submit(self, part: str) -> None:
        """Submit the tasks of `part` ("gen", "train" or "sync"); a train or sync submitted early
        (`submit_train_after`, `submit_sync_after`) is not submitted again."""
        if part in ("train", "sync") and part in self.submitted_at:
            return
        if part == "train" and self._sampling is not None:
            self.wait()  # the train task takes every round's groups: they are known once the rounds are done
        phases = PARTS[part]
        tasks = [t for t in self.lowered.tasks if t.phase in phases]
        self.submitted_at[part] = time.perf_counter()
        self.futures = submit(self.client, tasks, self.roles, self.futures)
        if part == "train":
            self._time(self.lowered.keys_of(self.train.name, "metrics"), "train")
        elif part == "sync":
            self._time(self.lowered.keys_of(self.sync.name, "status"), "sync")

    @property
    def samples_once(self) -> bool:
        """Whether the step's rollouts are all submitted (no dynamic sampling rounds may follow)."""
        return self._sampling is None

    def submit_sync_after(self, nxt: "Step") -> None:
        """Submit this step's sync now, to commit on each receiver once it runs none of `nxt`'s rollouts
        (all submitted) and none can come back to it: it stages the trained version on the receivers
        while they run, and the scheduler tells it when each receiver is clear of them
        (`rose.ops.train.sync_weights`, `rose.runtime.scheduler.barrier`), so neither the driver's round trip nor the transfer sits
        between two rollout phases. Needs the placement plugin (its `rose_keys_done` handler)."""
        if not nxt.samples_once:
            raise RunError(f"step {nxt.step} may roll out more rounds: step {self.step}'s sync cannot know "
                           "when its rollouts end", step=self.step)
        (task,) = [t for t in self.lowered.tasks if t.node == self.sync.name]
        task.kwargs = {**task.kwargs, "after": tuple(nxt._rollout_keys)}
        self._sync_after = True
        self.submit("sync")

    def submit_train_after(self, prev: "Step") -> None:
        """Submit this step's train task now, to start once its trajectories are scored and `prev`'s train
        task has ended (a Dask dependency: one trainer trains one step at a time). Its start then waits for
        no driver round trip, and the placement plugin sees it start (colocated rollout workers yield) about
        when the next step's rollouts can: submitted by the driver, it came after them, and rollouts placed
        on a colocated worker in between were shed there moments later."""
        if not self.samples_once:
            raise RunError(f"step {self.step} may roll out more rounds: its train task waits for them",
                           step=self.step)
        (before,) = [t for t in prev.lowered.tasks if t.node == prev.train.name and t.fn is train_step]
        (task,) = [t for t in self.lowered.tasks if t.node == self.train.name and t.fn is train_step]
        self.futures[before.key] = prev.futures[before.key]
        task.kwargs = {**task.kwargs, "after": Ref(before.key)}
        self._train_after = prev._done_at["train"]  # the list, not the step: no chain of finished steps
        self.submit("train")

    def _add_rollouts(self, graph, lowered) -> list[str]:
        """Count the rollouts of `graph` (lowered) as the step's: their trajectory ids and task keys."""
        rollouts = [n for n in graph.nodes.values() if get_op(n.op).phase == "rollout" and "specs" in n.inputs]
        self.ids |= {s.trajectory_id for n in rollouts
                     for s in lowered.outputs[(n.inputs["specs"].node, n.inputs["specs"].port)]}
        keys = [k for n in rollouts for k in lowered.keys_of(n.name, "trajectories")]
        self._rollout_keys += keys
        return keys

    def _time(self, keys: list[str], phase: str) -> None:
        for k in keys:
            self.futures[k].add_done_callback(lambda _f: self._done_at[phase].append(time.perf_counter()))

    def _futures(self, keys: list[str]) -> list:
        return [self.futures[k] for k in keys]

    def _await(self, futures: list) -> None:
        """Wait for `futures`, polling the fleet meanwhile: workers that connect join the run, and a
        trainer that left raises `TrainerLost` (tasks bound to it would otherwise wait forever)."""
        await_futures(self.client, futures, lambda: self.fleet.poll(self.version))

    def wait(self) -> None:
        """Wait for the step's rollouts; with dynamic sampling (DAPO), then for the scored trajectories its
        train node takes, rolling out more groups until enough of them vary. Without it the rewards are
        not waited for: the train task takes them in Dask, and what the runner does next (an asynchronous
        step's sync) needs only the rollouts done (10-30 ms sooner, the reward tasks' hop)."""
        self._await(self._futures(self._rollout_keys))
        if self._sampling is not None:
            self._await(self._futures(self.train_inputs))
        while self._sampling is not None and self._sample_more(self._sampling):
            self._await(self._futures(self._rollout_keys))
            self._await(self._futures(self.train_inputs))
        self._sampling = None
        done = self._done_at["rollout"]
        self.rollouts_done = max(done) if len(done) == len(self._rollout_keys) else time.perf_counter()
        self.rollout_s = self.rollouts_done - max([self.submitted_at["gen"], *self._weights_at])

    def _sample_more(self, cfg) -> bool:
        """Submit one more round of rollouts if the step has fewer varied groups than its prompts node
        asks for (`rose.runtime.dapo`); the train task then takes those too. Whether it did."""
        graph = self.pipeline.build(self.step)  # the same step, under another name: its task keys differ
        graph.name = f"{graph.name}-round{self.rounds}"
        prompts = [n for n in graph.nodes.values() if n.op == "prompts"]
        if len(prompts) != 1:
            raise RunError(f"dynamic sampling needs a step graph with one prompts node; {graph.name!r} has "
                           f"{len(prompts)}", step=self.step)
        target = prompts[0].params["num_groups"]
        table = concat(self.client.gather(self._futures(self.train_inputs)))
        groups = table["group_id"].to_numpy()
        ok = pc.not_equal(table["finish_reason"], "failed").to_numpy(zero_copy_only=False)
        kept = varied_groups(groups, table["reward"].to_numpy(zero_copy_only=False), ok)
        more = more_groups(target, len(set(groups.tolist())), len(kept), self.rounds, cfg.max_sample_rounds)
        if more == 0:
            return False
        prompts[0].params = {**prompts[0].params, "num_groups": more, "first_group": int(groups.max()) + 1}
        lowered = lower(graph, replace(self.ctx, graph=graph.name))
        self.futures = submit(self.client, [t for t in lowered.tasks if t.phase in PARTS["gen"]], self.roles,
                              self.futures)
        self._time(self._add_rollouts(graph, lowered), "rollout")
        self.train_inputs = self.train_inputs + lowered.input_keys(_the(graph, "train"), "trajectories")
        (train,) = [t for t in self.lowered.tasks if t.node == self.train.name and t.fn is train_step]
        train.args = (train.args[0], *(Ref(k) for k in self.train_inputs))
        self.rounds += 1
        logger.info("step %d: %d of %d groups vary; rolling out %d more (round %d)", self.step, len(kept), target,
                    more, self.rounds)
        return True

    def wait_trained(self) -> None:
        """Wait for the step's train task (the trainer trains one step at a time)."""
        self._await(self._futures(self.lowered.keys_of(self.train.name, "metrics")))

    def trained_version(self) -> int:
        """The weight version the step's train task made (once it is done)."""
        return self._train_metrics()["weight_version"]

    def _train_metrics(self) -> dict:
        """The train task's metrics, gathered once: the next-but-one step's start, a checkpoint and
        `finish` all read them."""
        if self._metrics is None:
            (self._metrics,) = self.client.gather(self._futures(self.lowered.keys_of(self.train.name, "metrics")))
        return self._metrics

    def finish(self) -> tuple[dict, pa.Table]:
        """Gather the train metrics and the sync statuses; check every engine took the trained version;
        return the step's row and its trajectories."""
        batches = self.client.gather(self._futures(self.train_inputs))
        metrics = self._train_metrics()
        # From when training could start (submitted, its rollouts done, the train step before it ended) to its metrics.
        ready = max(self.submitted_at["train"], self.rollouts_done, *self._train_after)
        train_s = max(self._done_at["train"] or [time.perf_counter()]) - ready
        t0 = time.perf_counter()
        self._await(self._futures(self.lowered.keys_of(self.sync.name, "status")))
        syncs = self.client.gather(self._futures(self.lowered.keys_of(self.sync.name, "status")))
        sync_s = time.perf_counter() - max(t0, self.submitted_at["sync"])
        if self._sync_after:  # submitted while the next step's rollouts ran: its own time, less that wait
            sync_s = max((r.get("seconds", 0.0) - r.get("waited_s", 0.0) for r in syncs), default=0.0)
        statuses = [s for sync_result in syncs for s in sync_result["statuses"]]
        self.fleet.synced_to(statuses, {a: why for r in syncs for a, why in r.get("unusable", {}).items()})
        new_versions = {s["weight_version"] for s in statuses}
        # No receiver (every rollout worker of the step left): workers that join catch up on their own.
        if statuses and new_versions != {metrics["weight_version"]}:
            raise RunError(f"engines hold weight versions {sorted(new_versions)} after sync, the trainer "
                           f"{metrics['weight_version']}", step=self.step)
        # Resumed trajectories whose replay failed were not trained on: they count as failed here too.
        table = mark_failed(concat(batches), metrics.get("provenance_failed", {}))
        row = step_row(self.step, metrics["weight_version"], table, metrics, self.rollout_s, train_s, sync_s)
        ledger = reconcile(self.step, self.ids, metrics["trajectory_ids"])
        if ledger.lost or ledger.duplicated:
            logger.error("step %d: %d planned trajectories never reached the trainer (%s), %d rows came again "
                         "or unplanned (%s)", self.step, ledger.lost, ", ".join(ledger.lost_ids), ledger.duplicated,
                         ", ".join(ledger.duplicated_ids))
        row["lost"], row["duplicated"] = ledger.lost, ledger.duplicated
        row["rollout_version"] = self.version
        row["provenance_checked"] = metrics.get("provenance_checked", 0)
        row["sync_bytes"] = sum(s.get("sent_bytes", 0) for s in syncs)
        row["sync_refetches"] = sum(s.get("refetches", 0) for s in syncs)
        # Dynamic sampling: the groups rolled out, those whose rewards varied, and the rounds it took
        row["groups_sampled"], row["groups_varied"] = metrics.get("groups_sampled"), metrics.get("groups_varied")
        row["sample_rounds"] = self.rounds
        return row, table

    def release(self) -> None:
        for f in self.futures.values():
            f.release()
        self.futures = {}
