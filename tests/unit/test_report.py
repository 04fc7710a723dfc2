"""A step's row: failures cannot make its reward look better."""
import math

from rose.report import step_row
from rose.runtime.trajectory import Trajectory, to_batch, with_rewards


def _table(rewards, failed):
    trajs = [Trajectory(0, 0, i, "guess", 1, finish_reason="failed" if f else "done") for i, f in enumerate(failed)]
    import pyarrow as pa

    return pa.Table.from_batches([with_rewards(to_batch(trajs), [math.nan if f else r
                                                                  for r, f in zip(rewards, failed)])])


def test_failed_trajectories_count_as_zero_reward():
    row = step_row(0, 1, _table([1.0, 1.0, 1.0, 1.0], [False, True, True, True]), {}, 1.0, 1.0, 0.1)
    assert row["failed"] == 3 and row["trajectories"] == 4
    assert row["reward_mean"] == 0.25  # not 1.0: the survivors alone would read as a perfect step


def test_a_step_without_failures_averages_its_rewards():
    row = step_row(0, 1, _table([1.0, 0.0, 0.5, 0.5], [False] * 4), {}, 1.0, 1.0, 0.1)
    assert row["failed"] == 0 and row["reward_mean"] == 0.5


def test_the_summary_compares_five_and_ten_step_blocks():
    import pandas as pd

    from rose.report import STEP_COLUMNS, Report

    rows = [{c: 0.0 for c in STEP_COLUMNS} | {"step": s, "reward_mean": s / 100, "step_s": 1.5} for s in range(30)]
    report = Report("guess", pd.DataFrame(rows, columns=STEP_COLUMNS), _table([], []), 0, 0)
    s = report.summary
    assert s["steps"] == 30 and s["steps_s"] == 45.0
    assert s["reward_first5"] == 0.02 and s["reward_last5"] == 0.27  # steps 0-4, 25-29
    assert s["reward_first10"] == 0.045 and s["reward_last10"] == 0.245  # steps 0-9, 20-29


def test_a_save_without_the_plot_writes_what_a_resume_reads_and_a_full_save_draws_it(tmp_path):
    import os

    import pandas as pd

    from rose.report import STEP_COLUMNS, Report

    rows = [{c: 0.0 for c in STEP_COLUMNS} | {"step": s, "reward_mean": 0.5, "step_s": 1.0} for s in range(3)]
    report = Report("guess", pd.DataFrame(rows, columns=STEP_COLUMNS), _table([0.5], [False]), 0, 0)
    written = report.save(str(tmp_path / "ckpt"), plot=False)
    assert sorted(written) == ["metrics", "summary", "trajectories"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["metrics.csv", "summary.json", "trajectories.parquet"]
    assert pd.read_csv(written["metrics"])["step"].tolist() == [0, 1, 2]
    written = report.save(str(tmp_path / "end"))
    assert os.path.getsize(written["plot"]) > 0 and written["plot"].endswith("reward.png")


def test_a_save_that_fails_midway_leaves_the_report_before_it_whole(tmp_path, monkeypatch):
    # A run killed while it writes a checkpoint's report: the resume reads the files of the checkpoint
    # before, so none may be left half-written.
    import os

    import pandas as pd
    import pyarrow.parquet as pq

    import rose.report
    from rose.report import STEP_COLUMNS, Report

    def report(steps: int, rows: int) -> Report:
        frame = pd.DataFrame([{c: 0.0 for c in STEP_COLUMNS} | {"step": s} for s in range(steps)], columns=STEP_COLUMNS)
        return Report("guess", frame, _table([0.5] * rows, [False] * rows), 0, 0)

    report(2, 3).save(str(tmp_path), plot=False)
    write_table = pq.write_table

    def dies_midway(table, where):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a file")
        raise OSError("killed")

    monkeypatch.setattr(rose.report.pq, "write_table", dies_midway)
    try:
        report(4, 5).save(str(tmp_path), plot=False)
    except OSError:
        pass
    else:
        raise AssertionError("the save did not fail")
    monkeypatch.setattr(rose.report.pq, "write_table", write_table)
    assert pq.read_table(tmp_path / "trajectories.parquet").num_rows == 3
    assert pd.read_csv(tmp_path / "metrics.csv")["step"].tolist() == [0, 1]
    assert sorted(os.listdir(tmp_path)) == ["metrics.csv", "summary.json", "trajectories.parquet"]
