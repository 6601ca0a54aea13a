"""The closure's forecasts scored against baselines a lab could use without a fit."""

import numpy as np
import pytest

from sdsl_jax.validation.closure import LOG_SCORE_FLOOR, baseline_scores


def _record(target, m, n, t, p):
    return dict(target=target, m_target=m, n_drafts=list(n), drafts=[f"d{int(v)}" for v in n],
                measured_tokens_per_flop=list(t), p_best=list(p))


def test_baselines_see_only_earlier_targets_and_the_skill_is_the_log_score_difference():
    records = [
        _record("A", 1e4, [1e2, 1e3], [1.0, 2.0], [0.2, 0.8]),
        _record("B", 1e5, [1e2, 1e3, 1e4], [1.0, 3.0, 2.9], [0.1, 0.6, 0.3]),
        _record("C", 1e6, [1e2, 1e3, 1e4, 1e5], [1.0, 2.0, 5.0, 3.0], [0.0, 0.1, 0.7, 0.2]),
    ]
    out = baseline_scores(records, seed=1)["all"]
    f = out["forecasts"]
    assert f["method"]["log_score"] == pytest.approx(np.log(0.8) + np.log(0.6) + np.log(0.7))
    assert f["uniform"]["log_score"] == pytest.approx(np.log(1 / 2) + np.log(1 / 3) + np.log(1 / 4))
    assert f["smallest"]["log_score"] == pytest.approx(3 * np.log(LOG_SCORE_FLOOR))  # never the best: floored
    # previous-best: uniform for A; for B half on A's best (1e3) and half on one size up; for C half on 1e3, half on 1e4.
    assert f["previous-best"]["log_score"] == pytest.approx(np.log(1 / 2) + np.log(0.5) + np.log(0.5))
    best = out["best_baseline"]
    assert best == max((k for k in f if k != "method"), key=lambda k: f[k]["log_score"])
    assert out["skill"] == pytest.approx(f["method"]["log_score"] - f[best]["log_score"])
    assert out["skill_90"][0] <= out["skill"] <= out["skill_90"][1]
    # Informative targets: two candidates within 10% of the best measured T (only B: 3.0 and 2.9).
    assert baseline_scores(records)["informative"]["targets"] == ["B"]
    assert f["method"]["regret"] == pytest.approx(np.mean([0.0, 0.0, 0.0]))


def test_baseline_scores_need_every_target_forecast():
    records = [_record("A", 1e4, [1e2, 1e3], [1.0, 2.0], [0.2, 0.8])]
    assert baseline_scores(records, "prospective_p_best") is None


def test_prior_sensitivity_reports_how_far_p_best_and_the_decision_move(monkeypatch):
    """The wide-prior fit's P(best) beside the in-sample one, per target; the fit it makes is the
    in-sample fit with every prior widened (the fit and its records stubbed: the bookkeeping alone)."""
    from sdsl_jax.validation import closure_fits

    asked = []

    def fake_fit(runs, pairs, settings, **kw):
        asked.append(settings.prior_width)
        return closure_fits.InSampleFit(None, None, None, "draws", None, {"chinchilla": dict(ok=False),
                                                                          "plane": dict(ok=True)})

    wide = [dict(target="A", p_best=[0.3, 0.7], bayes_decision="d1000"),
            dict(target="B", p_best=[0.5, 0.45, 0.05], bayes_decision="d100")]
    monkeypatch.setattr(closure_fits, "fit_in_sample", fake_fit)
    monkeypatch.setattr(closure_fits, "close_loop", lambda *a, **k: [dict(r) for r in wide])
    monkeypatch.setattr(closure_fits, "measured_perplexities", lambda pairs: {})
    records = [dict(target="A", p_best=[0.2, 0.8], bayes_decision="d1000"),
               dict(target="B", p_best=[0.1, 0.6, 0.3], bayes_decision="d1000")]
    out = closure_fits.prior_sensitivity(records, None, None, None, closure_fits.ClosureSettings(), width=3.0,
                                         log=lambda _: None)
    assert asked == [3.0]
    assert out["max_abs_change_p_best_per_target"] == pytest.approx({"A": 0.1, "B": 0.4})
    assert out["max_abs_change_p_best"] == pytest.approx(0.4)
    assert out["bayes_decisions_changed"] == ["B"] and out["failed_checks"] == ["chinchilla"]
    assert records[1]["p_best_wide_priors"] == [0.5, 0.45, 0.05] and records[1]["bayes_decision_wide_priors"] == "d100"


def test_the_measured_side_from_acceptance_rates_is_the_best_integer_lookahead_by_brute_force():
    from sdsl_jax.data import AcceptanceMeasurements
    from sdsl_jax.validation.closure import expected_speculative_runs

    # Two draft sizes, the first at two budgets (only its top one is a candidate), two targets.
    n_draft = np.array([1e4, 1e4, 3e4, 1e4, 3e4])
    d_draft = np.array([1e5, 4e5, 9e5, 4e5, 9e5])
    n_target = np.array([2e5, 2e5, 2e5, 1e6, 1e6])
    alpha = np.array([0.55, 0.62, 0.71, 0.58, 0.69])
    k, nan = alpha.size, np.full(alpha.size, np.nan)
    pairs = AcceptanceMeasurements(
        draft=("a@1", "a@4", "b@9", "a@4", "b@9"), target=("T", "T", "T", "U", "U"), n_draft=n_draft,
        n_target=n_target, d_draft=d_draft, d_target=np.full(k, 4e6), ppl_draft=np.full(k, 9.0),
        ppl_target=np.full(k, 5.0), alpha=alpha, gamma=nan, n_iterations=nan, accepted=nan, weight=nan,
        temperature=nan, source=(None,) * k)
    runs = expected_speculative_runs(pairs)
    assert runs.draft == ("a@4", "b@9", "a@4", "b@9") and runs.target == ("T", "T", "U", "U")
    gammas = np.arange(0, 200)
    for i, row in enumerate([1, 2, 3, 4]):
        a, n, m = alpha[row], n_draft[row], n_target[row]
        t = (1 - a ** (gammas + 1)) / ((1 - a) * (2 * n * gammas + 2 * m))  # the SDSL cost, every integer gamma
        assert runs.gamma[i] == gammas[np.argmax(t)]
        assert runs.tokens_per_flop_sdsl[i] == pytest.approx(t.max(), rel=1e-12)
        assert runs.alpha_mle[i] == a and runs.target_alone_tokens_per_flop_sdsl[i] == pytest.approx(1 / (2 * m))
    assert np.isnan(runs.wallclock_speedup).all() and runs.per_prompt(0) is None


def test_a_closure_on_acceptance_rates_alone_names_its_measured_side(tmp_path):
    # The factorial ladder has no speculative runs: its closure measures T from the exact acceptance rates.
    import json

    from experiments import closure

    assert closure.main(["--data", "fits/ladder", "--measured", "acceptance", "--starts", "50",
                         "--out", str(tmp_path), "--quiet", "--no-figure"]) == 0
    result = json.loads((tmp_path / "closure.json").read_text())
    assert "speculative" not in result["data"] and result["measured"].startswith("no speculative runs")
    assert len(result["targets"]) == 8  # every model but the smallest is a target
    for rec in result["targets"]:
        assert rec["fastest_wallclock"] is None and rec["measured_best_bootstrap"] is None
        t = np.array(rec["measured_tokens_per_flop"])
        assert rec["measured_best"] == rec["drafts"][int(np.argmax(t))]
    assert "Measured side: no speculative runs" in (tmp_path / "closure.md").read_text()


def _form(name: str, weight: float, scale_a: float, count: int = 200):
    """A form with loss-law draws around Hoffmann et al.'s, its A term scaled (moving N*), the paper's plane."""
    from sdsl_jax import HOFFMANN2022, SDSL2026, LossLaw, AcceptancePlane
    from sdsl_jax.validation.forms import FormFit

    rng = np.random.default_rng(int(scale_a * 10))
    law = LossLaw(*(np.full(count, float(v)) for v in HOFFMANN2022))
    law = law._replace(A=law.A * scale_a * np.exp(0.2 * rng.standard_normal(count)))
    plane = AcceptancePlane(*(np.full(count, float(v)) for v in SDSL2026))
    return FormFit(name, weight, None, (law, plane), None, None, None)


@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.8, 0.2)])
def test_the_stacked_n_star_band_is_the_mixture_of_the_forms_draws(weights):
    """The mixture's median lies between the forms' medians, its 5% and 95% within the forms' extremes,
    and with one form it is that form's own band (posterior_forecast's)."""
    from sdsl_jax.validation.closure import n_star_draws, n_star_fields
    from sdsl_jax.validation.forms import mixture_n_star

    kw = dict(m=7e10, d_target=1.4e12, d_ref=2e11, rho=20.0, n_star_recipe=3e8, seed=0)
    forms = [_form("low", weights[0], 0.3), _form("high", weights[1], 3.0)]
    alone = [n_star_fields(kw["m"], *n_star_draws(f.draws, f.scales, **kw)) for f in forms]
    mixed = mixture_n_star(forms, **kw)
    for key in ("n_star_band", "n_star_recipe_band"):
        lo, mid, hi = mixed[key]
        (lo_a, mid_a, hi_a), (lo_b, mid_b, hi_b) = (a[key] for a in alone)
        assert mid_a < mid_b  # the forms disagree: the test can tell a mixture from either form
        assert mid_a <= mid <= mid_b and min(lo_a, lo_b) <= lo and hi <= max(hi_a, hi_b)
        assert hi / lo > max(hi_a / lo_a, hi_b / lo_b)  # wider than either form's band: their disagreement
    lead = mixture_n_star([forms[0]._replace(weight=1.0)], **kw)
    assert lead == alone[0]


def test_a_closure_fit_sampled_at_another_target_acceptance_is_not_resumed(tmp_path):
    """A closure's stage key names the acceptance model's target acceptance as well as the law's:
    a fit stored while the planes' per-model effects sampled at another target acceptance is
    another fit (a model's target acceptance is a setting that may change)."""
    import dataclasses

    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.data import load_acceptance, load_pretraining
    from sdsl_jax.loss_laws import CHINCHILLA
    from sdsl_jax.validation.forms import Stages

    runs = load_pretraining("fits/ladder-v1/pretraining.csv")
    pairs = load_acceptance("fits/ladder-v1/acceptance.csv")
    assert pairs.model_effects_identified()[0]  # the planes sample per-model effects here
    stages = Stages(str(tmp_path), resume=True, settings=dict(chains=4))
    plane = ACCEPTANCE_MODELS["plane"]
    former = dataclasses.replace(plane, effects_target_accept=0.99)
    keys = [stages.store(runs, pairs, CHINCHILLA, model).inputs for model in (plane, former, plane)]
    assert keys[0] != keys[1] and keys[0] == keys[2]
