"""The faults `benchmarks/chaos.py` injects, and the bad inputs it sends. Loopback only.

Faults are armed per step (`FaultInjector.on_step` arms the next step's) and each waits for its
moment on the cluster: a kill "@rollout" lands once the victim runs a rollout task, "@train" once the
trainer runs the step's train task, "@sync" stalls a receiver's shard pulls and kills it once the
trainer runs the step's sync. Shard faults corrupt the next replies the trainer serves. A failed load
("fail_load_dedicated", "fail_load_serving") makes the next synced version's load into that worker's
rollout engine fail inside vLLM (the step's sync, or a catch-up).
"""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time

from rose.fleet import scheduler_workers
from rose.runtime.protocol import PLUGIN_NAME, ROLLOUT_KEY_PREFIX
from tests.helpers.faults import corrupt_next_replies, fail_next_load, stall_pulls


def _armed_corruption(dask_worker) -> bool:
    return "_serve" in dask_worker.plugins[PLUGIN_NAME].weights.__dict__


class FaultInjector:
    def __init__(self, client, schedule: dict[int, list[str]], timeout_s: float = 240.0):
        self.client, self.schedule, self.timeout_s = client, schedule, timeout_s
        self.done: list[dict] = []  # faults that landed: step, kind, detail
        self.missed = 0  # faults whose moment never came (the step ended first)
        self.corrupt_injected = 0
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._armed: set[int] = set()  # steps whose faults are armed: a step done again is not hit twice
        self._arm(0)

    def on_step(self, row: dict) -> None:
        self._arm(row["step"] + 1)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _arm(self, step: int) -> None:
        if step in self._armed:
            return
        self._armed.add(step)
        for kind in self.schedule.get(step, []):
            t = threading.Thread(target=self._do, args=(step, kind), daemon=True, name=f"fault-{kind}")
            t.start()
            self._threads.append(t)

    def corrupt_unsent(self) -> int:
        """Corruptions still armed on the trainer (no shard reply has gone out since): not injected."""
        trainer = self._by_role("trainer")
        if trainer is None:
            return 0
        return int(self.client.run(_armed_corruption, workers=[trainer])[trainer])

    def _workers(self) -> dict[str, dict]:
        return scheduler_workers(self.client)

    def _by_role(self, role: str) -> str | None:
        for addr, w in self._workers().items():
            if (w.get("metrics") or {}).get(PLUGIN_NAME, {}).get("role") == role:
                return addr
        return None

    def _processing(self, addr: str) -> list[str]:
        def keys(dask_scheduler, addr=addr):
            ws = dask_scheduler.workers.get(addr)
            return [ts.key for ts in ws.processing] if ws is not None else []

        return [str(k) for k in self.client.run_on_scheduler(keys)]

    def _wait_for(self, role: str, pred=None) -> str | None:
        """The `role` worker's address once it is connected with its role and (with `pred`) processes a
        task whose key satisfies `pred`."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            addr = self._by_role(role)
            if addr is not None and (pred is None or any(pred(k) for k in self._processing(addr))):
                return addr
            time.sleep(0.02)
        return None

    def _kill(self, addr: str) -> int:
        pid = self.client.run(os.getpid, workers=[addr])[addr]
        os.kill(pid, signal.SIGKILL)
        return pid

    def _do(self, step: int, kind: str) -> None:
        try:
            detail = self._inject(step, kind)
        except Exception as e:  # the victim left on its own, the cluster is closing
            detail = None
            print(f"  fault {kind} at step {step} could not be injected: {type(e).__name__}: {e}", file=sys.stderr)
        if detail is None:
            self.missed += 1
            return
        self.done.append({"step": step, "kind": kind, "detail": detail})
        print(f"  step {step}: {kind}: {detail}", file=sys.stderr, flush=True)

    def _inject(self, step: int, kind: str) -> str | None:
        what, _, when = kind.partition("@")
        if what in ("flip_shard", "truncate_shard"):
            trainer = self._by_role("trainer")
            self.client.run(corrupt_next_replies, "flip" if what == "flip_shard" else "truncate", workers=[trainer])
            self.corrupt_injected += 1
            return f"next shard reply from the trainer {trainer} {'flipped' if what == 'flip_shard' else 'truncated'}"
        if what in ("fail_load_dedicated", "fail_load_serving"):
            return self._fail_load(what.removeprefix("fail_load_"))
        role = {"kill_dedicated": "dedicated", "kill_serving": "serving", "kill_trainer": "trainer",
                "kill_receiver": "dedicated"}[what]
        if when == "sync":
            victim = self._wait_for(role)  # one restarted after an earlier kill reports its role once prepared
            if victim is None:
                return None
            self.client.run(stall_pulls, workers=[victim])
            if self._wait_for("trainer", lambda k: f"-sync-s{step}" in k) is None:
                return None
            time.sleep(0.5)  # the sync is now waiting on the stalled pull
            return f"SIGKILL pid {self._kill(victim)} ({victim}) during step {step}'s sync"
        suffix = f"-train-s{step}"
        pred = (lambda k: k.startswith(ROLLOUT_KEY_PREFIX)) if when == "rollout" else (lambda k: suffix in k)
        victim = self._wait_for(role, pred)
        if victim is None:
            return None
        return f"SIGKILL pid {self._kill(victim)} ({victim}) during {when}"

    def _fail_load(self, role: str) -> str | None:
        """Arm a failed load on the `role` worker once it has a rollout engine (a worker restarted after
        an earlier fault joins first), then wait for a load to hit it: landed once its engine reports
        itself unusable. A victim that leaves first, or a phase that ends first, counts as missed."""
        deadline = time.monotonic() + self.timeout_s
        victim = None
        while victim is None and time.monotonic() < deadline and not self._stop.is_set():
            victim = self._wait_for(role)
            try:
                if victim is None or not self.client.run(fail_next_load, workers=[victim])[victim]:
                    victim = None
            except AttributeError:  # no rollout engine yet
                victim = None
                time.sleep(0.5)
        armed_at = time.monotonic()
        while victim is not None and time.monotonic() < deadline and not self._stop.is_set():
            try:
                why = self.client.run(_unusable, workers=[victim])[victim]
            except Exception:  # it left (a dedicated worker restarts once its engine is unusable: look sooner)
                return None
            if why:
                return (f"a weight load into {victim}'s rollout engine failed inside vLLM "
                        f"{time.monotonic() - armed_at:.1f} s after arming: {why[:80]}...")
            time.sleep(0.02)
        return None


def _unusable(dask_worker) -> str | None:
    return dask_worker.plugins[PLUGIN_NAME].host.unusable


class _Traffic:
    """Serving traffic with 10x bursts to the serving worker's endpoint, in a thread."""

    def __init__(self, url: str, args, duration_s: float):
        from rose.runtime.coserve import traffic

        cap = asyncio.run(traffic.capacity(url, 5.0))
        # Bursts of 10x a base rate of 2 % of the measured capacity (closed-loop throughput, not what
        # the SLO allows: a burst near it misses the SLO with or without rollouts). The serving worker
        # shares its core with the trainer here.
        self.rate = 0.02 * cap
        self.burst = traffic.Burst(every_s=30.0, length_s=6.0, factor=10.0)
        arrivals = traffic.synthetic(self.rate, duration_s, (8, 24), (8, 24), self.burst, seed=args.seed)
        self.stop_event, self.box = threading.Event(), {}
        print(f"  serving: capacity {cap:.1f} req/s, base {self.rate:.2f} req/s, bursts of 10x for 6 s every 30 s",
              file=sys.stderr, flush=True)

        def go():
            self.box["report"] = asyncio.run(traffic.play(url, arrivals, args.ttft_ms, args.tpot_ms, seed=args.seed,
                                                          stop=self.stop_event))

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()

    def finish(self) -> dict:
        self.stop_event.set()
        self.thread.join(timeout=120)
        rep = self.box.get("report")
        if rep is None:
            return {"requests": 0, "slo_attainment": float("nan")}
        inside = [r for r in rep.results if (r.arrival.t % self.burst.every_s) < self.burst.length_s]
        ok = sum(rep.ok(r) for r in inside)
        return {"requests": len(rep.results), "burst_requests": len(inside),
                "slo_attainment": round(ok / len(inside), 4) if inside else float("nan"),
                "overall_attainment": round(rep.attainment, 4), "errors": sum(r.status != 200 for r in rep.results)}


def _serving_port(client) -> int:
    for w in scheduler_workers(client).values():
        rose = (w.get("metrics") or {}).get(PLUGIN_NAME, {})
        if rose.get("role") == "serving" and rose.get("http_port"):
            return int(rose["http_port"])
    raise RuntimeError("no serving worker with an HTTP port")


def serving_traffic(client, args, duration_s: float) -> _Traffic:
    return _Traffic(f"http://127.0.0.1:{_serving_port(client)}", args, duration_s)


def _send(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Send `data`, return the start of the answer (b"" if the server cut us off: fine for a huge body)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(data)
            return s.recv(4096)
    except OSError:
        return b""


def _request(body: bytes, content_type: str = "application/json", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {n}\r\nConnection: close\r\n\r\n").encode() + body


def hostile_http(client, n_fuzzed: int, seed: int = 0) -> tuple[int, bool]:
    """Send bad requests to the serving worker's endpoint; (requests tried, a good request is served
    afterwards)."""
    port = _serving_port(client)
    rng = random.Random(seed)
    fixed = [b"{", b"[]", b"null", b'{"prompt": 5}', b'{"prompt": [1, 2], "max_tokens": -1}',
             b'{"prompt": [1, 2], "max_tokens": 1000000000}', b'{"prompt": "x", "max_tokens": "many"}',
             b'{"prompt": [1e309]}', b'{"prompt": [' + b"1," * 100000 + b'1]}', "{\"prompt\": \"\u00e9\"}".encode(),
             b"\xff\xfe\x00garbage"]
    tried = 0
    for body in fixed:
        _send(port, _request(body))
        tried += 1
    _send(port, _request(b"", length=1 << 40))  # a declared huge body
    _send(port, _request(b"x" * (16 << 20)))  # an actual huge body
    tried += 2
    for _ in range(n_fuzzed):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        if rng.random() < 0.5:
            body = json.dumps({"prompt": [rng.randrange(-5, 1 << 33) for _ in range(rng.randrange(0, 5))],
                               "max_tokens": rng.choice([0, 1, -3, 2.5, None, "x", 1 << 40]),
                               rng.choice(["stream", "temperature", "n"]): rng.choice([True, -1, "z", None])}).encode()
        _send(port, _request(body))
        tried += 1
    # slow clients: headers sent, then silence; another stalls mid-body
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    for i, s in enumerate(slow):
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else _request(b'{"prompt"', length=100))
    tried += len(slow)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": [1, 5, 6], "max_tokens": 4}),
                     {"Content-Type": "application/json"})
        alive = conn.getresponse().status == 200
    except OSError:
        alive = False
    for s in slow:
        s.close()
    return tried, alive


def fuzz_graphs(n: int) -> tuple[int, int]:
    """Hypothesis-generated pipeline graphs (from scratch and damaged step graphs) through validation:
    (graphs tried, errors that were not ROSE's own ConfigError/GraphError)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from rose.errors import ConfigError, GraphError
    from tests.unit.test_graph_fuzz import damaged_step_graphs, scratch_graphs

    counts = {"tried": 0, "unexpected": 0}

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(scratch_graphs(), damaged_step_graphs()))
    def check(graph):
        counts["tried"] += 1
        try:
            graph.validate_step()
        except (ConfigError, GraphError):
            pass
        except Exception as e:  # noqa: BLE001 - counted: the claim is that none happens
            counts["unexpected"] += 1
            print(f"  fuzzed graph raised {type(e).__name__}: {e}", file=sys.stderr)

    check()
    return counts["tried"], counts["unexpected"]
