"""The committed closures decide only from what passed: a guard on the results in ``fits/``.

A closure's decisions (P(best), the Bayes decision, N*, regret) come from its fits: the one on all
the data, each prospective refit without a draft size and each forward refit before a target.
Every form carrying more than 5% of a fit's weight (all of an unstacked fit's forms) must have
passed its posterior checks there, and the law behind the point-fit columns must be finite, not a
coefficient at a bound of its fit. A remade closure that breaks either fails here.
"""

import glob
import json
import math

import pytest

CLOSURES = sorted(glob.glob("fits/**/closure.json", recursive=True))
WEIGHT = 0.05


def form_weights(forms: dict) -> dict:
    """Each law's and acceptance model's weight: the sum over the stacked (law + model) pairs it is in."""
    weights = {}
    for pair, weight in forms.items():
        for name in pair.split(" + "):
            weights[name] = weights.get(name, 0.0) + weight
    return weights


def deciding_fits(closure: dict):
    """(where, diagnostics, weights) of every fit a decision of the closure comes from; weights None
    where the fit was not stacked (every form it sampled decides)."""
    stacking = closure.get("stacking")
    if stacking:
        yield "all the data", stacking["diagnostics"], form_weights(stacking["forms"])
    else:
        yield "all the data", closure["diagnostics"], None
    for kind in ("prospective_fits", "forward_fits"):
        for key, fit in (closure.get(kind) or {}).items():
            forms = fit.get("forms")
            yield f"{kind} {key}", fit["diagnostics"], None if forms is None else form_weights(forms)


def test_there_are_committed_closures():
    assert {"fits/ladder/closure_stacked/closure.json", "fits/ladder-v1/closure/closure.json"} <= set(CLOSURES)


@pytest.mark.parametrize("path", CLOSURES)
def test_every_form_that_decides_passed_its_checks(path):
    closure = json.load(open(path))
    failing = []
    for where, diagnostics, weights in deciding_fits(closure):
        for name, check in diagnostics.items():
            weight = None if weights is None else weights.get(name, 0.0)
            if (weight is None or weight > WEIGHT) and not check["ok"]:
                failing.append(f"{where}: {name} (weight {weight}): {check['problems']}")
    assert not failing, f"{path}: forms that decide failed their checks: {failing}"


@pytest.mark.parametrize("path", CLOSURES)
def test_the_point_law_is_finite_and_off_its_bounds(path):
    law = json.load(open(path))["loss_law"]
    assert all(math.isfinite(v) and abs(v) < 1e30 for v in law.values()), f"{path}: {law}"
