"""What a fit reports: the advice for a failed posterior, the table read back from summary.json, the
posteriors a result records and how well they were sampled."""

import json
import math
import os

import pytest

from sdsl_jax import report
from sdsl_jax.figures import format_size
from sdsl_jax.infer import Diagnostics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_failed_posterior_advice_names_what_is_not_identified():
    from types import SimpleNamespace

    post = SimpleNamespace(identification=SimpleNamespace(
        flags=("A and alpha: identified only together (posterior correlation +0.998)",)))
    advice = report.diagnostics_advice("loss_law", post)
    assert "A and alpha: identified only together" in advice and "Longer chains will not fix this" in advice
    # Without unidentified parameters the advice is to sample longer.
    assert "Run longer" in report.diagnostics_advice("loss_law", SimpleNamespace(identification=SimpleNamespace(flags=())))


def test_failed_posterior_advice_names_the_tree_depth_cap_of_the_run_that_hit_it():
    """The advice reads the failed run's own tree-depth share (it once read an attribute the
    checks do not have, so that a posterior stuck at the cap was told to run longer)."""
    from types import SimpleNamespace

    from sdsl_jax.infer import Diagnostics, PosteriorChecks

    capped = Diagnostics(1.002, 900.0, 0, False, ("30% of draws at the maximum tree depth",), 800.0, 0.3)
    fine = capped._replace(ok=True, problems=(), mean_steps=15.0, max_tree_depth_share=0.0)
    post = SimpleNamespace(identification=SimpleNamespace(flags=()), diagnostics=PosteriorChecks(capped, fine))
    assert "maximum tree depth" in report.diagnostics_advice("loss_law", post)
    calm = SimpleNamespace(identification=SimpleNamespace(flags=()), diagnostics=PosteriorChecks(fine, fine))
    assert "maximum tree depth" not in report.diagnostics_advice("loss_law", calm)


def test_the_table_reads_only_the_summary():
    """The committed reference summary prints its table: every N* band and the linear law come from the
    record alone (a summary.json written earlier prints the same table)."""
    with open(os.path.join(REPO, "fits", "reference", "summary.json")) as handle:
        summary = json.load(handle)
    table = report.format_table(summary)
    for target in summary["targets"]:
        assert format_size(target["n_star_median"]) in table
    assert f"mu = {summary['linear_law']['mu']:.4g}" in table and "paper: mu = " in table


def test_a_point_fit_at_a_bound_is_named_and_never_shown_as_the_answer():
    """A law field at a bound of the fit (the irreducible loss driven to 0 here) is recorded; without
    a posterior the point N* is flagged as an artefact (a warning, and a line under the table), with
    one the table says its point column is the posterior median law's."""
    from types import SimpleNamespace

    import numpy as np

    with open(os.path.join(REPO, "fits", "reference", "summary.json")) as handle:
        summary = json.load(handle)
    summary["loss_law"].update(E=0.0, at_bound=["E"])
    runs = SimpleNamespace(n_params=np.array([1e8, 1e9]))  # the sizes the extrapolation flags read
    bare = {k: v for k, v in summary.items() if k != "posterior"}
    warnings_ = report.add_data_checks(bare, None, runs=runs, acceptance=None)
    assert any("E at a bound of the fit" in w and "--posterior" in w for w in warnings_)
    assert "artefact of where the optimiser stopped; run with --posterior" in report.format_table(bare)
    table = report.format_table(summary)
    assert "(posterior median law, posterior median" in table and "N* (point) column is the posterior median law's" in table
    # Without a field at a bound, neither line.
    summary["loss_law"]["at_bound"] = []
    assert "at a bound" not in report.format_table(summary)
    assert not any("at a bound" in w for w in report.add_data_checks(bare | {"loss_law": summary["loss_law"]}, None,
                                                                     runs=runs, acceptance=None))


def test_under_stacking_the_table_names_whose_point_fit_the_point_columns_are():
    """The shipped ladder fit stacks the forms: its bands are the mixture's, its point columns the
    --law fit's (Chinchilla). The table says whose each is, and with what weight, so a point outside
    its row's band reads as what it is; a form whose posterior failed is said to have failed, and
    each form's posterior on all the data is listed with its checks and geometry."""
    import copy

    with open(os.path.join(REPO, "fits", "ladder", "fit", "summary.json")) as handle:
        summary = json.load(handle)
    st = summary["stacking"]
    lead_weight = dict(zip(st["forms"], st["weights"]))["chinchilla"]
    table = report.format_table(summary)
    assert summary["loss_law"]["family"] == "chinchilla"
    assert ("the point columns (N* (point), gamma*, alpha, the speedup before its band) are the chinchilla law's "
            f"point fit (--law, stacking weight {lead_weight:.3f}" + (
                "; its posterior failed its checks)" if "chinchilla" in st["failed_checks"] else ")")) in table
    failed = copy.deepcopy(summary)
    failed["stacking"]["failed_checks"] = ["chinchilla"]
    failed["stacking"]["weights"] = [0.0 if f == "chinchilla" else w for f, w in zip(st["forms"], st["weights"])]
    assert ("are the chinchilla law's point fit (--law, stacking weight 0.000; its posterior failed its checks)"
            in report.format_table(failed))
    failed["stacking"]["diagnostics"] = {"chinchilla": dict(
        max_rhat=1.0123, min_ess_bulk=350.4, num_divergences=2, ok=False, median_steps=63.0, mean_steps=50.0,
        max_tree_depth_share=0.0, attempts=3, problems=["R-hat 1.012 >= 1.01", "2 divergent transitions"])}
    assert ("posterior on all the data: max R-hat 1.012, min bulk ESS 350, 2 divergent, 63 leapfrog steps per draw "
            "(median), 0% at the maximum tree depth, 3 run(s); failed: R-hat 1.012 >= 1.01; 2 divergent "
            "transitions") in report.format_table(failed)


def _checks(**changes):
    checks = Diagnostics(max_rhat=1.004, min_ess_bulk=900.0, num_divergences=0, ok=True, problems=(),
                         mean_steps=40.0, max_tree_depth_share=0.0, median_steps=63.0, attempts=1)
    return checks._replace(**changes)


def test_diagnostics_read_back_from_json_are_the_ones_written():
    d = _checks(ok=False, problems=("R-hat 1.02 >= 1.01 (chains disagree)",), attempts=3)
    assert Diagnostics.from_record(json.loads(json.dumps(d._asdict()))) == d
    # A record without the step counts, NaN written as null (strict JSON): not recorded, NaN.
    old = {k: v for k, v in d._asdict().items() if k not in ("mean_steps", "median_steps", "attempts")}
    back = Diagnostics.from_record({**old, "max_tree_depth_share": None})
    assert math.isnan(back.median_steps) and math.isnan(back.max_tree_depth_share) and back.attempts == 1
    with pytest.raises(ValueError, match="missing \\['ok'\\]"):
        Diagnostics.from_record({k: v for k, v in d._asdict().items() if k != "ok"})
    with pytest.raises(ValueError, match="unknown fields \\['steps'\\]"):
        Diagnostics.from_record({**d._asdict(), "steps": 3})


def test_recorded_posteriors_are_found_at_any_depth_and_a_run_recorded_twice_counts_once():
    fit, refit = _checks()._asdict(), _checks(median_steps=127.0, min_ess_bulk=350.0)._asdict()
    record = dict(command="x", stacking=dict(diagnostics=dict(chinchilla=fit), forms={"chinchilla": 1.0}),
                  diagnostics=dict(chinchilla=fit),
                  prospective_fits={"24832": dict(diagnostics=dict(chinchilla=refit,
                                                                   plane=fit | {"max_rhat": 1.0}))},
                  folds=[dict(diagnostics=dict(kaplan=refit | {"attempts": 2}))])
    found = report.recorded_posteriors(json.loads(json.dumps(record)))
    assert [p.places for p in found] == [
        ("stacking/diagnostics/chinchilla", "diagnostics/chinchilla"),
        ("prospective_fits/24832/diagnostics/chinchilla",),
        ("prospective_fits/24832/diagnostics/plane",),
        ("folds/0/diagnostics/kaplan",),
    ]
    assert found[1].diagnostics == _checks(median_steps=127.0, min_ess_bulk=350.0)
    assert report.recorded_posteriors(dict(command="x", rows=[1, 2])) == []
    broken = dict(fits=[dict(diagnostics=dict(plane=fit | {"ok": True, "rhat": 1.0}))])
    with pytest.raises(ValueError, match="fits/0/diagnostics/plane: .*unknown fields"):
        report.recorded_posteriors(broken)


@pytest.mark.parametrize("changes, shortfalls", [
    (dict(), ()),
    (dict(median_steps=64.0), ()),
    (dict(median_steps=127.0), ("127 leapfrog steps per draw (median) > 64",)),
    (dict(max_tree_depth_share=0.00025), ("0.025% of draws at the maximum tree depth",)),
    (dict(min_ess_bulk=400.0), ()),
    (dict(min_ess_bulk=399.5), ("bulk ESS 399.5 < 400",)),
    (dict(min_ess_bulk=float("nan")), ("bulk ESS nan < 400",)),
    (dict(median_steps=float("nan"), max_tree_depth_share=float("nan"), min_ess_bulk=10.0),
     ("steps per draw not recorded", "bulk ESS 10 < 400")),
])
def test_geometry_shortfalls_at_the_goal_s_edges(changes, shortfalls):
    assert report.geometry_shortfalls(_checks(**changes)) == shortfalls


def test_geometry_goal_is_the_caller_s():
    d = _checks(median_steps=127.0, max_tree_depth_share=0.004, min_ess_bulk=300.0)
    loose = dict(max_median_steps=255, max_tree_depth_share=0.01, min_ess_bulk=200)
    assert report.geometry_shortfalls(d, **loose) == ()


def test_a_null_count_or_verdict_is_not_read_as_nan():
    record = _checks()._asdict() | {"min_ess_bulk": None, "ok": None}
    back = Diagnostics.from_record(record)
    assert math.isnan(back.min_ess_bulk) and back.ok is None
