"""examples/quickstart.ipynb runs top to bottom in a fresh kernel, and shows what it says it shows."""
import os
import shutil

import pytest

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_quickstart_notebook_runs_and_shows_metrics_a_plot_and_trajectories(tmp_path):
    import nbclient
    import nbformat

    # A copy beside a copy of the pipelines: the run folder it writes lands in tmp_path, not the checkout.
    shutil.copytree(os.path.join(ROOT, "pipelines"), tmp_path / "pipelines")
    (tmp_path / "examples").mkdir()
    nb = nbformat.read(os.path.join(ROOT, "examples", "quickstart.ipynb"), as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path / "examples")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "'steps': 8" in text and "'lost': 0" in text  # the summary
    assert any("text/html" in o.get("data", {}) and "reward_mean" in o["data"]["text/html"] for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the reward plot
    assert "prompt: 'find 1 16'" in text and "policy: 'guess" in text  # trajectories as text
    assert (tmp_path / "examples" / "runs" / "quickstart" / "metrics.csv").exists()
