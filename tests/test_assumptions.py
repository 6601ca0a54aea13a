"""sdsl_jax.assumptions: settings from the data or a refusal, extrapolation factors, the perplexity scale."""

import numpy as np
import pytest

import sdsl_jax as sd
from sdsl_jax.assumptions import format_assumptions, unlabelled_repeats
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns


def pairs(n_draft, n_target, d_draft, d_target, ppl_draft=None, ppl_target=None):
    n_draft, n_target = np.asarray(n_draft, float), np.asarray(n_target, float)
    k = n_draft.size
    full = lambda v: np.broadcast_to(np.asarray(v, float), (k,)).copy()
    nan = np.full(k, np.nan)
    return AcceptanceMeasurements(
        draft=tuple(f"d{i}" for i in range(k)), target=tuple(f"t{i}" for i in range(k)), n_draft=n_draft,
        n_target=n_target, d_draft=full(d_draft), d_target=full(d_target),
        ppl_draft=full(10.0 if ppl_draft is None else ppl_draft), ppl_target=full(5.0 if ppl_target is None else
                                                                              ppl_target),
        alpha=full(0.6), gamma=nan, n_iterations=nan, accepted=nan, weight=nan, temperature=nan, source=(None,) * k)


def test_settings_come_from_flags_then_from_the_data():
    acc = pairs([1e8, 2e8, 1e8], [7e9, 7e9, 1.3e10], 1e11, 2e12)
    s = sd.settings_from_data(acc, source="pairs.csv")
    assert (s.d_draft.value, s.d_target.value, s.targets.value) == (1e11, 2e12, (7e9, 1.3e10))
    assert s.m_range.value == (7e9, 1.3e10) and "pairs.csv" in s.d_target.source
    s = sd.settings_from_data(acc, d_target=3e12, targets=[7e10])
    assert s.d_target == sd.Setting(3e12, "--d-target") and s.targets.value == (7e10,)
    assert s.m_range.value == (3.5e10, 1.4e11)  # a factor of two either side of one target
    assert sd.settings_from_data(acc, needs_d_draft=False).d_draft.value is None


def test_settings_the_data_cannot_give_are_refused_naming_the_flag():
    with pytest.raises(sd.SettingsError, match="give --d-draft"):
        sd.settings_from_data(None)
    with pytest.raises(sd.SettingsError, match="give --targets"):
        sd.settings_from_data(None, d_draft=1e11, d_target=1e12)
    with pytest.raises(sd.SettingsError, match="give --d-target: .* 2 different d_target values"):
        sd.settings_from_data(pairs([1e8, 2e8], [7e9, 7e9], 1e11, [2e12, 3e12]))


def test_extrapolation_factors_against_a_direct_computation():
    e = sd.extrapolation(7e10, 3e8, run_sizes=[1e8, 1e9, 1.6e10], draft_sizes=[5e7, 1e8], target_sizes=[7e9])
    assert e.target_over_runs == pytest.approx(7e10 / 1.6e10) and e.target_over_measured == pytest.approx(10.0)
    assert e.n_star_outside_drafts == pytest.approx(3.0) and e.n_star_outside_runs == 1.0
    assert e.flags == ("M 4.38x largest run", "M 10x largest measured target", "N* 3x outside measured drafts")
    inside = sd.extrapolation(1e9, 5e8, run_sizes=[1e8, 2e9])
    assert inside.flags == () and np.isnan(inside.target_over_measured)
    below = sd.extrapolation(1e9, 1e7, run_sizes=[1e8, 2e9])
    assert below.n_star_outside_runs == pytest.approx(10.0)


def test_perplexity_scale_compares_the_law_with_the_measured_perplexities():
    law = sd.BESIROGLU2024
    n, m, d, dt = np.array([1e8, 3e8]), np.array([7e9, 7e9]), 1e11, 2e12
    x, y = np.exp(np.asarray(law.loss(n, d))), np.exp(np.asarray(law.loss(m, dt)))
    same = sd.perplexity_scale(law, pairs(n, m, d, dt, x, y))
    assert same.consistent and same.ratio == pytest.approx(1.0) and same.models == 3  # two drafts, one target
    other = sd.perplexity_scale(law, pairs(n, m, d, dt, 2 * x, 2 * y))
    assert not other.consistent and other.ratio == pytest.approx(0.5) and "another text or tokenizer" in other.message


def test_unlabelled_repeats_and_the_assumptions_block():
    empty = (None,) * 4
    runs = PretrainingRuns(n_params=np.array([1e8, 1e8, 2e8, 1e8]), n_tokens=np.array([1e9, 2e9, 1e9, 1e9]),
                           loss=np.ones(4) * 3, name=empty, flops=np.full(4, np.nan), source=empty)
    assert unlabelled_repeats(runs) == (0, 3)
    assert unlabelled_repeats(runs.select(np.array([0, 1, 2]))) is None
    record = dict(data=dict(pretraining=dict(path="runs.csv", sha256="ab" * 32), acceptance=None),
                  **sd.settings_from_data(None, d_draft=1e11, d_target=1e12, targets=[7e9]).as_dict(),
                  recipe="fixed", cost="flops", law="chinchilla", acceptance_model="fixed", runs="as labelled")
    lines = format_assumptions(record)
    assert lines[0] == "Assumptions:" and "  target budget D': 1e+12 (--d-target)" in lines
