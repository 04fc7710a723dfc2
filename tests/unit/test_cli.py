"""`rose run`'s options reach the pipeline the run gets (rose.run itself stood in: no cluster here)."""
import os

from click.testing import CliRunner

import rose
from rose.cli import main

GUESS = os.path.join(os.path.dirname(__file__), "..", "..", "pipelines", "guess.py")


def test_trainers_shards_the_local_clusters_trainer_and_is_refused_with_a_scheduler(monkeypatch):
    got = {}

    def run(p, **kwargs):
        got["pipeline"], got["kwargs"] = p, kwargs
        raise rose.errors.ConfigError("stood in")

    monkeypatch.setattr(rose, "run", run)
    result = CliRunner().invoke(main, ["run", GUESS, "--trainers", "2", "--steps", "1"])
    assert "stood in" in result.output and got["pipeline"].cluster.num_trainers == 2
    from dataclasses import replace

    from rose.pipeline import load_pipeline

    shipped = load_pipeline(GUESS).cluster  # the rest of the pipeline's cluster as it was
    assert shipped.num_trainers == 1 and got["pipeline"].cluster == replace(shipped, num_trainers=2)
    result = CliRunner().invoke(main, ["run", GUESS, "--trainers", "2", "--scheduler", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2 and "--rose-role trainer" in result.output
    result = CliRunner().invoke(main, ["run", GUESS, "--trainers", "0"])
    assert result.exit_code == 2 and "--trainers" in result.output
