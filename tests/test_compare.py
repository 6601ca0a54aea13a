"""One stacking for every comparison of forms: the optimiser against brute force and ArviZ, the mixing rule."""

import warnings

import numpy as np
import pytest

from sdsl_jax.compare import (_stack_passing, failed_form_note, failed_forms_worth_rerunning, grouped_stacking_weights,
                               mixture_draw_indices, mixture_log_density, stack)


def _score(w, log_density):
    return np.sum(np.log(w @ np.exp(log_density)))


def test_stack_maximises_the_held_out_log_score():
    rng = np.random.default_rng(1)
    log_density = np.log(rng.uniform(0.05, 1.0, (3, 40)))
    log_density[0] += 0.3  # one form clearly better on average
    w = stack(log_density)
    assert np.isclose(w.sum(), 1.0) and np.all(w >= 0)
    grid = [np.array([a, b, 1 - a - b]) for a in np.linspace(0, 1, 101) for b in np.linspace(0, 1, 101) if a + b <= 1]
    assert _score(w, log_density) >= max(_score(v, log_density) for v in grid) - 1e-9
    assert np.isclose(mixture_log_density(log_density, w), _score(w, log_density), rtol=1e-12)


def test_stack_agrees_with_arviz_stacking_of_psis_loo():
    """The weights ArviZ's ``az.compare(method="stacking")`` gives on the same PSIS-LOO densities,
    which is what ``stacking_weights`` returned before it called :func:`stack`."""
    az = pytest.importorskip("arviz")
    from sdsl_jax.compare import _stacked

    rng = np.random.default_rng(0)
    y = rng.standard_t(4, 60)
    pointwise, idata = {}, {}
    for name, (loc, scale) in {"good": (0.0, 1.2), "shifted": (0.4, 1.0), "wide": (0.0, 3.0)}.items():
        mu = loc + 0.05 * rng.standard_normal((400, 1))
        ll = -0.5 * ((y - mu) / scale) ** 2 - np.log(scale * np.sqrt(2 * np.pi))
        sigma = np.full(400, scale)
        pointwise[name] = (ll, sigma)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata[name] = az.from_dict(posterior={"sigma": sigma[None]}, log_likelihood={"obs": ll[None]})
    ours = _stacked(pointwise, "rows")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = az.compare(idata, ic="loo", method="stacking")
    theirs = np.array([table.loc[n, "weight"] for n in ours.names])
    np.testing.assert_allclose(ours.weights, theirs, atol=1e-4)
    np.testing.assert_allclose(ours.elpd_loo, [table.loc[n, "elpd_loo"] for n in ours.names], rtol=1e-10)
    np.testing.assert_allclose(ours.elpd_se, [table.loc[n, "se"] for n in ours.names], rtol=1e-10)


def test_grouped_weights_name_their_method_and_refuse_non_finite_densities():
    w = grouped_stacking_weights({"a": np.array([-1.0, -2.0]), "b": np.array([-3.0, -0.5])}, groups="model sizes")
    assert w.names == ("a", "b") and np.isclose(w.weights.sum(), 1) and "model sizes left out" in w.method
    with pytest.raises(ValueError, match="non-finite"):
        stack(np.array([[-1.0, np.nan], [-2.0, -1.0]]))


def test_a_form_whose_posterior_failed_its_checks_gets_no_weight():
    rng = np.random.default_rng(2)
    log_density = {"a": np.log(rng.uniform(0.05, 1.0, 30)) + 0.5, "b": np.log(rng.uniform(0.05, 1.0, 30)),
                   "c": np.log(rng.uniform(0.05, 1.0, 30))}
    every = grouped_stacking_weights(log_density, groups="sizes")
    assert every.weights[0] > 0.5 and every.failed == ()  # "a", the best, would lead
    passing = grouped_stacking_weights(log_density, groups="sizes", failed=("a",))
    assert passing.weights[0] == 0.0 and passing.failed == ("a",) and "weight 0" in passing.method
    np.testing.assert_allclose(passing.weights[1:], stack(np.stack([log_density["b"], log_density["c"]])))
    # Every form failed: all are stacked as before, and the method says so.
    failed_all = grouped_stacking_weights(log_density, groups="sizes", failed=("a", "b", "c"))
    np.testing.assert_allclose(failed_all.weights, every.weights)
    assert "every form failed" in failed_all.method


def test_a_failed_form_is_worth_rerunning_only_where_it_would_carry_weight():
    rng = np.random.default_rng(4)
    # "a" fits every point best, "c" worst: unchecked, "a" leads and "c" gets (almost) nothing.
    base = np.log(rng.uniform(0.05, 1.0, 40))
    log_density = {"a": base + 1.0, "b": base + 0.2 * rng.normal(size=40), "c": base - 3.0}
    w = grouped_stacking_weights(log_density, groups="sizes", failed=("a", "c"))
    assert w.weights[0] == 0.0 and w.weights[1] == 1.0  # gated: only "b" passed
    np.testing.assert_allclose(w.unchecked_weights, stack(np.stack(list(log_density.values()))))
    assert w.unchecked_weights[0] > 0.5 and w.unchecked_weights[2] < 0.01
    assert failed_forms_worth_rerunning(w, min_weight=0.01) == ("a",)  # "c" failed too, but carries nothing
    assert failed_forms_worth_rerunning(w, min_weight=0.0) == ("a", "c")
    assert failed_forms_worth_rerunning(grouped_stacking_weights(log_density, groups="sizes"), min_weight=0.0) == ()


def test_mixture_takes_each_forms_share_of_distinct_draws():
    shares = mixture_draw_indices(["a", "b", "c"], np.array([0.7, 0.3, 0.0004]), 1000, seed=3)
    assert [name for name, _ in shares] == ["a", "b"]  # a share that rounds to no draw is left out
    for (name, idx), count in zip(shares, (700, 300)):
        assert idx.size == count and np.unique(idx).size == count and idx.min() >= 0 and idx.max() < 1000
    assert not np.array_equal(np.sort(shares[0][1]), np.arange(700))  # a random subset, not the first chains


def test_failed_forms_get_no_weight_unless_every_form_failed_and_the_line_says_which():
    rng = np.random.default_rng(0)
    log_density = rng.normal(-1.0, 0.3, (3, 40))
    weights, note, unchecked = _stack_passing(log_density, [True, False, False])
    assert weights[0] == 0 and np.isclose(weights.sum(), 1) and "get weight 0" in note
    np.testing.assert_allclose(unchecked, stack(log_density))
    weights, note, _ = _stack_passing(log_density, [True, True, True])
    np.testing.assert_allclose(weights, stack(log_density))
    assert "every form failed" in note
    assert failed_form_note("a", ["a", "b"], ["a"]) == " (its posterior failed its checks: no weight)"
    assert "stacked all the same" in failed_form_note("a", ["a", "b"], ["a", "b"])
    assert failed_form_note("b", ["a", "b"], ["a"]) == ""


def _sized_runs(sizes, budgets_per_size=3, seed=0):
    """Runs of a Chinchilla law with a strong N term, one run per size, a little noise."""
    from sdsl_jax import LossLaw
    from sdsl_jax.data import PretrainingRuns

    law = LossLaw(E=1.7, A=400.0, alpha=0.34, B=2000.0, beta=0.3)
    n = np.repeat(np.asarray(sizes, np.float64), budgets_per_size)
    d = n * np.tile(np.geomspace(10.0, 40.0, budgets_per_size), len(sizes))
    loss = np.asarray(law.loss(n, d)) * np.exp(0.005 * np.random.default_rng(seed).standard_normal(n.size))
    return PretrainingRuns(n_params=n, n_tokens=d, loss=loss, name=(None,) * n.size, flops=6 * n * d,
                           source=(None,) * n.size)


def test_size_folds_weigh_forms_by_sizes_they_did_not_see_and_resume_fold_by_fold(tmp_path, monkeypatch):
    """Leaving each size out, a law with an N term predicts the left-out size and a data-only law
    cannot: Chinchilla's law takes the weight; every row gets a held-out density; a second call
    with the same stages fits nothing again."""
    from sdsl_jax import CHINCHILLA, DATA_ONLY, infer
    from sdsl_jax.compare import size_fold_weights
    from sdsl_jax.store import StageStore

    runs = _sized_runs([1e7, 3e7, 1e8, 3e8])
    settings = dict(num_chains=1, num_warmup=100, num_samples=100, seed=0, log=lambda _: None)
    stores = lambda name: StageStore(str(tmp_path / name), resume=True, inputs=dict(form=name))  # noqa: E731
    folds = size_fold_weights(runs, [CHINCHILLA, DATA_ONLY], stages_for=stores, **settings)
    assert folds.weights.names == ("chinchilla", "data") and "model sizes left out" in folds.weights.method
    assert folds.weights.weights[0] > 0.9
    for name in ("chinchilla", "data"):
        assert folds.log_density[name].shape == (len(runs),) and np.isfinite(folds.log_density[name]).all()
    assert folds.log_density["chinchilla"].sum() > folds.log_density["data"].sum() + 5.0

    def refuse(*args, **kw):
        raise AssertionError("a stored fold was fitted again")

    monkeypatch.setattr(infer, "sample_loss_law", refuse)
    again = size_fold_weights(runs, [CHINCHILLA, DATA_ONLY], stages_for=stores, **settings)
    np.testing.assert_array_equal(again.log_density["chinchilla"], folds.log_density["chinchilla"])


def test_size_folds_group_neighbouring_sizes_and_stack_only_forms_every_fold_can_identify():
    """More sizes than ``max_folds``: neighbouring sizes leave together. A law needing three sizes
    cannot be fitted without one of three: then no form is weighted by sizes (None), before any fit."""
    from sdsl_jax import CHINCHILLA, DATA_ONLY
    from sdsl_jax.compare import size_fold_weights

    seen = []
    runs = _sized_runs([1e7, 2e7, 4e7, 8e7, 1.6e8, 3.2e8])
    out = size_fold_weights(runs, [DATA_ONLY, CHINCHILLA], max_folds=2, num_chains=1, num_warmup=30, num_samples=30,
                            log=seen.append)
    assert out.weights.names == ("data", "chinchilla")
    assert [line.split(":")[1].strip() for line in seen[:2]] == [
        "data without size(s) 1e+07-4e+07", "data without size(s) 8e+07-3.2e+08"]
    seen.clear()
    three = _sized_runs([1e7, 1e8, 1e9])
    assert size_fold_weights(three, [DATA_ONLY, CHINCHILLA], num_chains=1, num_warmup=50, num_samples=50,
                             log=seen.append) is None
    assert len(seen) == 1 and "chinchilla cannot be fitted without size(s) 1e+07" in seen[0]


@pytest.mark.slow  # its size folds are covered fast above; this is the closure's wiring (about a minute)
def test_a_closure_fit_weighs_its_laws_by_sizes_it_did_not_see():
    """``fit_forms(weights_by="sizes")``, what every closure refit runs with ``--stack-by sizes``: the
    laws' weights from their size folds, PSIS-LOO's recorded beside them."""
    from sdsl_jax import CHINCHILLA, DATA_ONLY, PLANE
    from sdsl_jax.validation.forms import fit_forms

    runs = _sized_runs([1e7, 3e7, 1e8, 3e8])
    forms, summary = fit_forms(runs, None, families=[CHINCHILLA, DATA_ONLY], models=(PLANE,), starts_every=50,
                               chains=1, warmup=100, draws=100, propagate=50, seed=0, weights_by="sizes",
                               log=lambda _: None)
    assert summary["method"].startswith("Bayesian stacking of held-out predictive densities")
    laws = summary["laws"]
    assert laws["chinchilla"]["weight"] > 0.9 and forms[0].name.startswith("chinchilla")
    assert laws["chinchilla"]["held_out_log_density"] > laws["data"]["held_out_log_density"]
    assert all(np.isfinite(laws[n]["elpd_loo"]) for n in laws)  # row-wise PSIS-LOO, for comparison


def test_a_form_whose_posterior_on_all_the_data_failed_gets_no_size_fold_weight(monkeypatch):
    """``failed`` names forms whose posterior on all the data failed its checks: no weight, whatever
    their folds could say (their draws are what the mixture would use), so their folds are not
    fitted while another form passed. The folds here are made to pass (short chains would fail on
    ESS and leave every form failed, when all are stacked)."""
    from sdsl_jax import CHINCHILLA, DATA_ONLY, infer
    from sdsl_jax.compare import size_fold_weights

    sample, fitted = infer.sample_loss_law, []

    def passing(*args, family, **kw):
        fitted.append(family.name)
        out = sample(*args, family=family, **kw)
        return out._replace(diagnostics=out.diagnostics._replace(ok=True, problems=()))

    monkeypatch.setattr(infer, "sample_loss_law", passing)
    runs, lines = _sized_runs([1e7, 3e7, 1e8, 3e8]), []
    folds = size_fold_weights(runs, [CHINCHILLA, DATA_ONLY], failed=("chinchilla",), num_chains=1, num_warmup=30,
                              num_samples=30, log=lines.append)
    assert folds.weights.failed == ("chinchilla",) and list(folds.weights.weights) == [0.0, 1.0]
    assert fitted == ["data"] * 4 and "chinchilla not refitted by size" in lines[0]
    assert np.isnan(folds.log_density["chinchilla"]).all() and np.isnan(folds.weights.elpd_loo[0])
    assert "failed its checks get weight 0" in folds.weights.method


def _saturating_pairs(seed=0):
    """Four draft sizes each paired with three larger targets, acceptance from a logit plane (it
    saturates: no plane on raw perplexities follows it across sizes), with a little noise. Every
    draft size has as many pairs, so every fold that leaves one out fits data of one shape (one
    compiled sampler per model)."""
    from sdsl_jax import LogitPlane
    from sdsl_jax.data import AcceptanceMeasurements

    sizes = np.geomspace(1e6, 1e9, 7)
    ppl = 2.0 + 30.0 * (sizes / 1e6) ** -0.25
    pairs = [(i, j) for j in range(4, 7) for i in range(4)]
    x, y = ppl[[i for i, _ in pairs]], ppl[[j for _, j in pairs]]
    alpha = np.asarray(LogitPlane(-0.5, 0.6, 3.0).rate(x, y))
    alpha = np.clip(alpha + np.random.default_rng(seed).normal(0.0, 0.005, alpha.size), 0.01, 0.99)
    nan, ones = np.full(len(pairs), np.nan), np.ones(len(pairs))
    return AcceptanceMeasurements(
        draft=tuple(f"d{i}" for i, _ in pairs), target=tuple(f"t{j}" for _, j in pairs),
        n_draft=sizes[[i for i, _ in pairs]], n_target=sizes[[j for _, j in pairs]], d_draft=1e10 * ones,
        d_target=1e10 * ones, ppl_draft=x, ppl_target=y, alpha=alpha, gamma=nan, n_iterations=nan, accepted=nan,
        weight=nan, temperature=ones, source=(None,) * len(pairs))


def test_draft_size_folds_weigh_acceptance_models_by_drafts_they_did_not_see_and_resume(tmp_path, monkeypatch):
    """Leaving each draft size out (its pairs with every target), the saturating model the pairs came
    from predicts them and the plane does not: it takes the weight; every pair is scored once; a
    second call with the same stages fits nothing again."""
    from sdsl_jax import LOGIT_PLANE, PLANE
    from sdsl_jax.compare import draft_size_fold_weights
    from sdsl_jax.store import StageStore
    from sdsl_jax.validation import holdout

    pairs = _saturating_pairs()
    settings = dict(num_chains=1, num_warmup=150, num_samples=150, seed=0, log=lambda _: None)
    stores = lambda name: StageStore(str(tmp_path / name), resume=True, inputs=dict(form=name))  # noqa: E731
    folds = draft_size_fold_weights(pairs, [PLANE, LOGIT_PLANE], stages_for=stores, **settings)
    assert folds.weights.names == ("plane", "logit-plane") and "draft sizes left out" in folds.weights.method
    for name in folds.weights.names:
        assert folds.log_density[name].shape == (len(pairs),) and np.isfinite(folds.log_density[name]).all()
    assert folds.log_density["logit-plane"].sum() > folds.log_density["plane"].sum() + 5.0
    assert folds.weights.weights[1] > 0.9

    def refuse(*args, **kw):
        raise AssertionError("a stored fold was fitted again")

    monkeypatch.setattr(holdout, "acceptance_fold", refuse)
    again = draft_size_fold_weights(pairs, [PLANE, LOGIT_PLANE], stages_for=stores, **settings)
    np.testing.assert_array_equal(again.log_density["plane"], folds.log_density["plane"])


@pytest.mark.slow  # the draft-size folds are covered fast above; this is the closure's wiring
def test_a_closure_fit_weighs_its_acceptance_models_by_draft_sizes_it_did_not_see():
    """``fit_forms(weights_by="sizes")`` with pairs: the acceptance models' weights from their
    draft-size folds, PSIS-LOO over pairs recorded beside them."""
    from sdsl_jax import CHINCHILLA, LOGIT_PLANE, PLANE
    from sdsl_jax.validation.forms import fit_forms

    runs, pairs = _sized_runs([1e7, 3e7, 1e8, 3e8]), _saturating_pairs()
    forms, summary = fit_forms(runs, pairs, families=[CHINCHILLA], models=(PLANE, LOGIT_PLANE), starts_every=50,
                               chains=1, warmup=150, draws=150, propagate=50, seed=0, weights_by="sizes",
                               log=lambda _: None)
    models = summary["acceptance_models"]
    assert models["logit-plane"]["held_out_log_density"] > models["plane"]["held_out_log_density"]
    assert models["logit-plane"]["weight"] > 0.9 and forms[0].name == "chinchilla + logit-plane"
    assert all(np.isfinite(models[n]["elpd_loo"]) for n in models)  # PSIS-LOO over pairs, for comparison


def test_an_unknown_stacking_density_is_refused_by_name(capsys):
    from experiments import closure, fit
    from sdsl_jax.compare import stack_forms
    from sdsl_jax.validation.forms import fit_forms

    # Any other string used to mean rows, silently: a misspelt "size" would have fitted another study.
    with pytest.raises(ValueError, match=r"weights_by: 'size' is not a stacking density; choose one of 'rows', 'sizes'"):
        fit_forms(None, None, families=(), models=(), starts_every=1, chains=1, warmup=1, draws=1, propagate=1,
                  seed=0, weights_by="size")
    with pytest.raises(ValueError, match="weights_by: 'folds'"):
        stack_forms(None, None, None, families=(), m_grid=np.ones(1), targets=np.ones(1), d_target=1.0,
                    recipe=None, weights_by="folds")
    for parse in (closure.parse_args, fit.parse_args):
        with pytest.raises(SystemExit):
            parse(["--stack-by", "size"])
        assert "invalid choice: 'size' (choose from 'rows', 'sizes')" in capsys.readouterr().err
