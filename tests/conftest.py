import os

import pytest

# Worker processes started by integration tests import test helpers ("tests.helpers.envs:...").
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")

# Property tests assert behaviour, never time: hypothesis's default 200 ms deadline per example failed a
# schedule test on a host busy with a training run (278 ms once, 5 ms on the retry).
try:
    from hypothesis import settings

    settings.register_profile("rose", deadline=None)
    settings.load_profile("rose")
except ImportError:  # the property tests themselves need hypothesis; nothing else does
    pass


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
