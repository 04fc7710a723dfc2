"""The driver's view of rollout workers joining a run, against a stand-in client (no processes)."""
import pytest

from rose import fleet as fleet_mod
from rose.errors import RunError
from rose.fleet import JOIN_ATTEMPTS, Fleet


class FakeFuture:
    def __init__(self, outcome):
        self.outcome = outcome

    def done(self):
        return True

    def result(self):
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class FakeClient:
    """Workers by role as the scheduler reports them; each prepare+catch-up fails while `failures` lasts."""

    def __init__(self, workers: dict[str, str], failures: int = 0):
        self.workers, self.failures, self.submitted = workers, failures, []

    @property
    def scheduler(self):
        return self  # client.scheduler.identity(...)

    def sync(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    def identity(self, n_workers=-1):
        # role None: connected, but its last heartbeat carried no ROSE report
        return {"workers": {a: {"metrics": {"rose": {"worker": a, "role": r}} if r else {}}
                            for a, r in self.workers.items()}}

    def submit(self, fn, *args, key=None, **kwargs):
        self.submitted.append(key)
        if key.startswith("rose-catch-up"):
            if self.failures:
                self.failures -= 1
                return FakeFuture(RuntimeError("engine build failed"))
            return FakeFuture({"version": 2})
        return FakeFuture(None)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(fleet_mod, "JOIN_RETRY_S", 0.0)


def test_a_worker_whose_preparation_failed_is_tried_again():
    client = FakeClient({"tcp://t": "trainer", "tcp://d": "dedicated"}, failures=1)
    f = Fleet(client, spec=None, trainer="tcp://t", ready=[])
    f.poll(2)  # attempt 1 starts
    f.poll(2)  # ... fails; attempt 2 starts
    f.poll(2)  # ... joins
    assert f.ready == ["tcp://d"] and f.synced["tcp://d"] == 2 and f.attempts["tcp://d"] == 2
    assert "tcp://d" not in f.failed


def test_the_fleet_gives_up_on_a_worker_after_its_attempts():
    client = FakeClient({"tcp://t": "trainer", "tcp://d": "dedicated"}, failures=100)
    f = Fleet(client, spec=None, trainer="tcp://t", ready=[])
    for _ in range(2 * JOIN_ATTEMPTS + 2):
        f.poll(2)
    assert f.ready == [] and f.attempts["tcp://d"] == JOIN_ATTEMPTS and "engine build failed" in f.failed["tcp://d"]
    with pytest.raises(RunError, match="none connected in 0 s.*engine build failed"):
        f.wait_for_worker(2, timeout_s=0.0, step=5, poll_s=0.0)


def test_with_no_rollout_worker_the_run_waits_for_one():
    client = FakeClient({"tcp://t": "trainer"})
    f = Fleet(client, spec=None, trainer="tcp://t", ready=[])
    polls = []
    real_poll = f.poll

    def poll(version):  # a worker connects on the third look
        polls.append(version)
        if len(polls) == 3:
            client.workers["tcp://new"] = "dedicated"
        real_poll(version)

    f.poll = poll
    f.wait_for_worker(1, timeout_s=30.0, step=4, poll_s=0.0)
    assert f.ready == ["tcp://new"] or "tcp://new" in f.joining


def test_a_trainer_that_left_ends_every_poll_until_one_connects():
    client = FakeClient({"tcp://t": "trainer", "tcp://d": "dedicated"})
    f = Fleet(client, spec=None, trainer="tcp://t", ready=["tcp://d"])
    f.poll(1)  # the trainer is there: nothing to say
    del client.workers["tcp://t"]
    with pytest.raises(fleet_mod.TrainerLost, match="tcp://t left the run"):
        f.poll(1)
    client.workers["tcp://x"] = None  # connected, without a ROSE report (its plugin did not start)
    with pytest.raises(RunError, match=r"no trainer worker connected in 0 s.*\(connected now: tcp://d \(dedicated\), "
                                       r"tcp://x \(no ROSE report\)\)"):
        fleet_mod.wait_for_trainer(client, timeout_s=0.0, poll_s=0.0, gone="tcp://t")
    client.workers["tcp://t2"] = "trainer"  # the nanny restarted it, at a new address
    assert fleet_mod.wait_for_trainer(client, timeout_s=0.0, poll_s=0.0, gone="tcp://t") == "tcp://t2"


def test_a_worker_whose_heartbeat_lacks_its_report_is_not_taken_for_gone():
    client = FakeClient({"tcp://t": "trainer", "tcp://d": "dedicated"})
    f = Fleet(client, spec=None, trainer="tcp://t", ready=["tcp://d"])
    client.workers.update({"tcp://t": None, "tcp://d": None})  # still connected, no report this time
    f.poll(0)
    assert f.ready == ["tcp://d"] and f.lost == {}


def test_a_sharded_trainers_rank_that_left_is_a_lost_trainer_naming_it():
    from types import SimpleNamespace

    from rose.fleet import TrainerLost

    client = FakeClient({"tcp://t": "trainer", "tcp://d": "dedicated"})
    f = Fleet(client, spec=SimpleNamespace(trainer_peers=("tcp://p",)), trainer="tcp://t", ready=["tcp://d"])
    with pytest.raises(TrainerLost, match="tcp://p, a rank of the trainer") as lost:
        f.check_trainer()
    assert lost.value.context["worker"] == "tcp://p"  # the runner rebuilds the trainer without it
    client.workers["tcp://p"] = "trainer"
    assert "tcp://p" in f.check_trainer()
