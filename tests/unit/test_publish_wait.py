"""The trainer's endpoint publishes a new version only once the sync of the version it publishes now has
finished: a running sync serves that version's shards and deltas, which a publish replaces."""
import threading
from types import SimpleNamespace

import pytest
import torch

from rose.errors import EngineError
from rose.runtime.weights.endpoint import WeightEndpoint


def _params(v: int) -> dict:
    return {"w": torch.full((256,), float(v)), "b": torch.arange(16, dtype=torch.float32) + v}


def _trainer_endpoint() -> WeightEndpoint:
    """A trainer's endpoint as `prepare` leaves it: version 0 published and counted as synced."""
    ep = WeightEndpoint(SimpleNamespace(handlers={}, address="tcp://trainer"), "default", dtype="float32",
                        shard_bytes=512)
    ep.publish(_params(0), 0)
    ep.mark_synced(0)
    ep.publish(_params(1), 1)  # version 0 was synced: at once
    return ep


def _publish_in_thread(ep: WeightEndpoint, version: int, **kwargs):
    out: dict = {}

    def publish():
        try:
            out["manifest"] = ep.publish(_params(version), version, **kwargs)
        except Exception as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    return t, out


def test_a_publish_blocks_until_the_version_before_is_synced():
    ep = _trainer_endpoint()
    t, out = _publish_in_thread(ep, 2)
    t.join(0.3)
    assert t.is_alive() and ep.version == 1  # the sync of version 1 still reads it
    ep.mark_synced(0)  # an older sync does not release it
    t.join(0.1)
    assert t.is_alive()
    ep.mark_synced(1)
    t.join(5)
    assert not t.is_alive() and "error" not in out
    assert ep.version == 2 and out["manifest"].version == 2 and ep.prev.version == 1
    assert ep.publish_wait_s >= 0.3


def test_a_publish_fails_when_the_sync_it_waits_for_fails():
    ep = _trainer_endpoint()
    t, out = _publish_in_thread(ep, 2)
    t.join(0.1)
    assert t.is_alive()
    ep.mark_synced(1, error="OSError: receiver gone")
    t.join(5)
    assert not t.is_alive()
    assert isinstance(out.get("error"), EngineError)
    assert "sync of weight version 1 failed: OSError: receiver gone" in str(out["error"])
    assert ep.version == 1  # nothing was published


def test_a_publish_gives_up_after_its_timeout():
    ep = _trainer_endpoint()
    with pytest.raises(EngineError, match="sync of weight version 1 did not finish in 0 s"):
        ep.publish(_params(2), 2, timeout_s=0.05)
    assert ep.version == 1


def test_in_a_synchronous_run_a_publish_never_waits():
    ep = _trainer_endpoint()
    for v in range(2, 6):
        ep.mark_synced(v - 1)  # the step's sync finished before the next step trains
        ep.publish(_params(v), v, timeout_s=0.5)
        assert ep.version == v and ep.publish_wait_s < 0.1
