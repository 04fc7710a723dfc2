"""The by-hand cluster of the README: `dask scheduler --preload rose.plugin` and `dask worker --preload
rose.worker --rose-role ...` started as subprocesses, one RL step driven through them; and the bad
input those commands must refuse clearly."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest
from distributed import Client

import rose
from tests.integration.helpers import small_pipeline

BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([os.path.join(BIN, "dask"), *args], stdout=log, stderr=subprocess.STDOUT, env=ENV,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def stop(client, procs, logs) -> None:
    if client is not None:
        client.close()
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    for f in logs:
        f.close()


def wait_workers(client: Client, n: int, timeout: float = 600) -> None:
    # A worker process imports torch and vLLM before it connects: minutes on a busy 2-core host.
    t0 = time.monotonic()
    while len(client.scheduler_info(n_workers=-1)["workers"]) < n:
        assert time.monotonic() - t0 < timeout, "workers did not connect"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def by_hand(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("by_hand")
    port, dash = free_port(), free_port()
    addr = f"tcp://127.0.0.1:{port}"
    logs = {name: open(log_dir / f"{name}.log", "w+") for name in ("scheduler", "trainer", "dedicated")}
    procs = [start(["scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", f"127.0.0.1:{dash}",
                    "--preload", "rose.plugin", "--rose-policy", "rose"], logs["scheduler"])]
    client = None
    try:
        client = Client(addr, timeout=60)
        procs.append(start(["worker", addr, "--nthreads", "2", "--preload", "rose.worker", "--rose-role", "trainer",
                            "--rose-cores", "1"], logs["trainer"]))
        wait_workers(client, 1)
        client.dashboard_port = dash
        yield client, addr, procs, logs
    finally:
        stop(client, procs, logs.values())


def log_text(f) -> str:
    f.flush()
    f.seek(0)
    return f.read()


def error_records(text: str) -> list[str]:
    """The log's ERROR records and its tracebacks, each with the line above it. Dask logs one ordinary
    event with a traceback at INFO: a client's comm that closes as the scheduler writes to it ("Batched
    Comm Closed"); that one is no error. ROSE's own lines carry no timestamp, so a traceback is judged by
    the line it follows, not by the record it falls in."""
    lines = text.splitlines()
    bad = [line for line in lines if re.search(r" - (ERROR|CRITICAL) - ", line)]
    for i, line in enumerate(lines):
        above = lines[i - 1] if i else ""
        if line.startswith("Traceback") and not re.search(r" - INFO - Batched Comm Closed ", above):
            bad.append(f"{above}\n{line}")
    return bad


def plugin_state(client) -> dict:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["rose"].state())


def test_rollouts_wait_with_one_warning_until_a_rollout_worker_joins(by_hand):
    client, addr, procs, logs = by_hand
    # A rollout task with no rollout-capable worker connected: parked, one warning, no error storm.
    probe = client.submit(sum, [1, 2], key="rose-rollout-probe", pure=False)
    t0 = time.monotonic()
    while not plugin_state(client)["warning"]:
        assert time.monotonic() - t0 < 30, "no warning"
        time.sleep(0.1)
    time.sleep(1.0)  # several dispatch rounds
    assert probe.status == "pending"
    assert log_text(logs["scheduler"]).count("rollout tasks wait: no rollout-capable worker") == 1
    assert plugin_state(client)["errors"] == 0
    probe.release()


def test_unknown_role_is_refused(by_hand):
    client, addr, procs, logs = by_hand
    # By the worker's own command line, with the choices listed...
    out = subprocess.run([os.path.join(BIN, "dask"), "worker", addr, "--preload", "rose.worker", "--rose-role", "gpu",
                          "--no-nanny", "--death-timeout", "10"], capture_output=True, text=True, timeout=120, env=ENV)
    text = out.stdout + out.stderr
    assert "'gpu' is not one of 'trainer', 'dedicated', 'serving', 'reward'" in text, text[-2000:]
    # ...and by the plugin, for a report that names an unknown role.
    trainer = next(iter(client.scheduler_info(n_workers=-1)["workers"]))

    def bogus(dask_worker):
        dask_worker.log_event("rose-capacity", {"worker": dask_worker.address, "role": "gpu", "slots": 8})

    client.run(bogus, workers=[trainer])
    t0 = time.monotonic()
    while trainer not in plugin_state(client)["refused"]:
        assert time.monotonic() - t0 < 10
        time.sleep(0.1)
    assert "unknown role 'gpu'" in plugin_state(client)["refused"][trainer]
    assert "refusing worker" in log_text(logs["scheduler"])


def test_bad_policy_is_a_cli_error():
    out = subprocess.run([os.path.join(BIN, "dask"), "scheduler", "--port", "0", "--dashboard-address", ":0",
                          "--preload", "rose.plugin", "--rose-policy", "best"], capture_output=True, text=True,
                         timeout=120, env=ENV)
    assert out.returncode != 0
    assert "'best' is not one of 'rose', 'fixed', 'elastic'" in out.stdout + out.stderr


def test_one_step_through_by_hand_processes(by_hand):
    client, addr, procs, logs = by_hand
    procs.append(start(["worker", addr, "--nthreads", "64", "--preload", "rose.worker", "--rose-role", "dedicated",
                        "--rose-cores", "0"], logs["dedicated"]))
    wait_workers(client, 2)
    report = rose.run(small_pipeline("guess", groups=2, group_size=4), cluster=addr, steps=1, progress=False)
    t = report.trajectories
    assert t.num_rows == 8 and report.lost == 0 and report.duplicated == 0
    assert set(t["placement"].to_pylist()) == {"dedicated"}
    state = plugin_state(client)
    assert state["policy"] == "rose" and state["errors"] == 0
    (d,) = [a for a, w in state["workers"].items() if w["role"] == "dedicated"]
    assert state["workers"][d]["dispatched"] == 2 and state["workers"][d]["weight_version"] == 1


def test_dashboard_has_a_rose_page(by_hand):
    import urllib.request

    client, addr, procs, logs = by_hand
    import urllib.error

    base = f"http://127.0.0.1:{client.dashboard_port}"
    with urllib.request.urlopen(f"{base}/rose", timeout=30) as r:
        html = r.read().decode()
    assert r.status == 200 and "bokeh" in html  # a bokeh page is served there...
    with pytest.raises(urllib.error.HTTPError, match="404"):  # ...and not for just any path
        urllib.request.urlopen(f"{base}/rose-nothing", timeout=30)
    assert error_records(log_text(logs["scheduler"])) == []


def test_a_scheduler_without_the_plugin_still_runs_a_step_with_one_warning(tmp_path, caplog):
    import logging

    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    logs = [open(tmp_path / f"{n}.log", "w+") for n in ("scheduler", "trainer", "dedicated")]
    procs = [start(["scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0"], logs[0])]
    client = None
    try:
        client = Client(addr, timeout=60)
        procs.append(start(["worker", addr, "--nthreads", "2", "--preload", "rose.worker", "--rose-role", "trainer",
                            "--rose-cores", "1"], logs[1]))
        procs.append(start(["worker", addr, "--nthreads", "64", "--preload", "rose.worker", "--rose-role",
                            "dedicated", "--rose-cores", "0"], logs[2]))
        wait_workers(client, 2)
        with caplog.at_level(logging.WARNING, logger="rose.run"):
            report = rose.run(small_pipeline("guess", groups=2, group_size=4), cluster=client, steps=1,
                              progress=False)
        assert report.trajectories.num_rows == 8 and report.lost == 0 and report.duplicated == 0
        warnings = [r for r in caplog.records if "without the ROSE placement plugin" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        stop(client, procs, logs)
