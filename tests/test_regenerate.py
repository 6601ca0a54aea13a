"""Committed results regenerate from their recorded commands (experiments.regenerate)."""

import math
import sys

from experiments import regenerate


def test_the_recorded_command_is_rerun_into_another_folder_without_resuming():
    command = regenerate.rerun_command("python -m experiments.closure --data fits/ladder-v1 --posterior --out "
                                       "fits/ladder-v1/closure_broken --quiet --resume", "/tmp/x")
    assert command == [sys.executable, "-m", "experiments.closure", "--data", "fits/ladder-v1", "--posterior",
                       "--out", "/tmp/x", "--quiet"]


def test_differences_see_numbers_structure_and_text_but_not_provenance():
    committed = dict(date="a", seed=0, targets=[dict(n_star=100.0, name="x")], law=dict(mu=2.0))
    assert regenerate.differences(committed, dict(committed, date="b")) == (0.0, [])
    worst, notes = regenerate.differences(committed, dict(committed, law=dict(mu=2.0 * (1 + 1e-3))))
    assert math.isclose(worst, 1e-3 / (1 + 1e-3), rel_tol=1e-9) and notes == []  # relative to the larger
    assert regenerate.differences(committed, dict(committed, targets=[]))[0] == math.inf
    worst, notes = regenerate.differences(committed, dict(committed, targets=[dict(n_star=100.0, name="y")]))
    assert worst == math.inf and notes == ["/targets[0]/name: 'x' committed, 'y' remade"]
    assert regenerate.differences(committed, {k: v for k, v in committed.items() if k != "seed"})[1] == [
        "/seed: only in the committed file"]


def test_the_committed_score_of_the_registered_prediction_reproduces(tmp_path):
    entry = next(e for e in regenerate.COMMITTED if e.name == "score")
    result = regenerate.regenerate(entry, str(tmp_path), rtol=1e-12)
    assert result["ok"], result
