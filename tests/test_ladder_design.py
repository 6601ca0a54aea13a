"""The factorial ladder's design (experiments.ladder, preset 'factorial'): size and budget vary
independently, and the held-back models cannot be trained before their predictions exist."""

import numpy as np
import pytest

from experiments import ladder
from sdsl_jax.lm import ladder as rungs

FACTORIAL = rungs.PRESETS["factorial"]


def _rows(preset, held_back=False):
    rows = []
    for rung in preset.rungs:
        if rung.held_back and not held_back:
            continue
        plan = rungs.plan_rung(rung, preset, rungs.rung_n_params(rung, preset))
        rows += [(plan.n_params, b * plan.tokens_per_step) for b in plan.budgets]
    return np.array(rows, float)


def test_every_size_shares_every_budget_so_size_and_data_are_uncorrelated():
    rows = _rows(FACTORIAL)
    sizes = np.unique(rows[:, 0])
    assert len(sizes) == 7
    per_size = [set(np.round(rows[rows[:, 0] == n, 1], -4)) for n in sizes]
    shared = set.intersection(*per_size)
    assert min(len(b) for b in per_size) >= 4 and len(shared) >= 3
    assert abs(np.corrcoef(np.log(rows).T)[0, 1]) < 0.3
    # The real ladder, for contrast: budgets tied to size.
    assert abs(np.corrcoef(np.log(_rows(rungs.PRESETS["real"])).T)[0, 1]) > 0.3


def test_the_held_back_models_extend_the_ladder_where_the_prediction_is_tested():
    sizes = {r.name: rungs.rung_n_params(r, FACTORIAL) for r in FACTORIAL.rungs}
    held = [r.name for r in FACTORIAL.rungs if r.held_back]
    assert sizes["H8"] >= 2.5e6 and sizes["H8"] > max(v for k, v in sizes.items() if k not in held)
    assert sizes["L2"] < sizes["H2"] < sizes["L3"]


@pytest.mark.parametrize("args, fragment", [(["--rungs", "H8"], "give --held-back PREDICTIONS"),
                                            (["--held-back", "missing.json"], "no such predictions file")])
def test_held_back_rungs_need_their_committed_predictions(args, fragment, tmp_path, capsys):
    assert ladder.main(["--preset", "factorial", "--out", str(tmp_path / "out"), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and not (tmp_path / "out").exists()
