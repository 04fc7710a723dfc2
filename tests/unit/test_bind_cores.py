"""A worker bound to its cores binds every thread it has, not only the one that asks."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, threading
from rose.runtime.worker.process import bind_to_cores

started, stop = threading.Event(), threading.Event()
tid = []
def early():
    tid.append(threading.get_native_id()); started.set(); stop.wait()
t = threading.Thread(target=early); t.start(); started.wait()
bind_to_cores(({core},))
later = []
u = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(threading.get_native_id()))))
u.start(); u.join()
print(json.dumps({{"early": sorted(os.sched_getaffinity(tid[0])), "main": sorted(os.sched_getaffinity(0)),
                  "later": later[0]}}))
stop.set(); t.join()
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to bind to one")
def test_threads_started_before_binding_are_bound_too():
    core = max(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(core=core)], capture_output=True, text=True,
                         timeout=60, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"early": [core], "main": [core], "later": [core]}, seen
