"""Simulation-based calibration (`sdsl_jax.validation.calibration`): the rank test against SciPy, the
study against an exact conjugate posterior (it must pass) and an overconfident one (it must fail),
resuming, and the loss-law wiring. The full study over the ladder's design: `python -m
experiments.calibration --only sbc` (docs/benchmarks.md)."""

import json

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import stats

from sdsl_jax.acceptance import ACCEPTANCE_MODELS
from sdsl_jax.infer.models import MODEL_EFFECT_SITES, PLANE_SITES, loss_law_sites
from sdsl_jax.infer.posterior import acceptance_numpyro_model, loss_law_numpyro_model
from sdsl_jax.loss_laws import FAMILIES
from sdsl_jax.validation.calibration import (loss_law_sbc, prior_datasets, rank_of_truth, rank_uniformity,
                                             simulation_based_calibration)

ROWS = 5


def normal_mean_model(design, y=None):
    """mu ~ N(0, 1), y_i ~ N(mu, 1): the posterior of mu is N(sum y / (n + 1), 1 / (n + 1))."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("rows", design.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def exact_fit(scale: float = 1.0, calls: list | None = None):
    """Draws of the exact posterior of mu, its sd multiplied by ``scale`` (1: exact)."""
    def fit(y, seed):
        if calls is not None:
            calls.append(seed)
        rng = np.random.default_rng(seed)
        mean, sd = y.sum() / (y.size + 1), scale / np.sqrt(y.size + 1)
        return {"mu": mean + sd * rng.standard_normal(400)}, ()
    return fit


def study(fit, datasets=300, **kw):
    return simulation_based_calibration(normal_mean_model, (np.zeros(ROWS),), fit, obs_site="y", sites=("mu",),
                                        datasets=datasets, seed=3, **kw)


def test_rank_uniformity_is_scipys_chi_square_on_equal_bins():
    rng = np.random.default_rng(0)
    ranks = rng.integers(0, 100, 500)
    counts, chi2, p = rank_uniformity(ranks, 99, bins=10)
    np.testing.assert_array_equal(counts, np.histogram(ranks, bins=np.arange(0, 101, 10))[0])
    assert (chi2, p) == pytest.approx(tuple(stats.chisquare(counts)))
    assert p > 0.01
    u_shape = np.concatenate([rng.integers(0, 10, 250), rng.integers(90, 100, 250)])
    assert rank_uniformity(u_shape, 99, bins=10)[2] < 1e-10
    with pytest.raises(ValueError, match="equal bins"):
        rank_uniformity(ranks, 98, bins=10)
    with pytest.raises(ValueError, match=r"ranks must lie in \[0, 99\]"):
        rank_uniformity(np.array([100]), 99, bins=10)


def test_rank_of_truth_counts_evenly_thinned_draws_below_it():
    draws = np.arange(1000.0)
    # The kept draws are round(k 999 / 98) for k = 0..98: 0, 10, 20, 31, ..., 500 (k = 49), 510, ..., 999.
    assert rank_of_truth(draws, 505.0, keep=99) == 50
    assert rank_of_truth(draws, 500.0, keep=99) == 49
    assert rank_of_truth(draws, -1.0, keep=99) == 0 and rank_of_truth(draws, 1e9, keep=99) == 99
    with pytest.raises(ValueError, match="cannot be thinned to 99"):
        rank_of_truth(np.arange(50.0), 0.0, keep=99)


def test_an_exact_posterior_passes_and_an_overconfident_one_fails():
    exact = study(exact_fit())
    assert exact.ranks.shape == (300, 1) and exact.num_draws == 99
    assert exact.min_p_value() > 0.01, exact.tests
    # Half the posterior's width: true values fall outside the draws, ranks pile at both ends.
    narrow = study(exact_fit(0.5))
    assert narrow.min_p_value() < 1e-6, narrow.tests
    counts = narrow.tests[0].counts
    assert counts[0] + counts[-1] > 3 * counts[4:6].sum() / 2


def test_a_study_resumes_from_its_finished_datasets(tmp_path):
    stage = str(tmp_path / "sbc.jsonl")
    first_calls, second_calls = [], []
    first = study(exact_fit(calls=first_calls), datasets=12, stage_path=stage)
    # A run killed while writing its last line: that dataset is fitted again, the others are not.
    lines = open(stage).read().splitlines()
    with open(stage, "w") as f:
        f.write("\n".join(lines[:-1]) + "\n" + lines[-1][:10])
    again = study(exact_fit(calls=second_calls), datasets=12, stage_path=stage)
    assert len(first_calls) == 12 and second_calls == [3 + 11]
    np.testing.assert_array_equal(first.ranks, again.ranks)
    # Another seed or count is another study (the prior draws differ): nothing of this one is reused.
    other_calls = []
    for seed, datasets in ((4, 2), (3, 13)):
        simulation_based_calibration(normal_mean_model, (np.zeros(ROWS),), exact_fit(calls=other_calls), obs_site="y",
                                     sites=("mu",), datasets=datasets, seed=seed, stage_path=stage)
    assert len(other_calls) == 2 + 13
    # So is the same seed and count under other settings (a prior's width): fitted again, then reused.
    study_calls = []
    for _ in range(2):
        simulation_based_calibration(normal_mean_model, (np.zeros(ROWS),), exact_fit(calls=study_calls), obs_site="y",
                                     sites=("mu",), datasets=12, seed=3, stage_path=stage, study=dict(width=2))
    assert len(study_calls) == 12
    assert all(json.loads(line)["sites"] == ["mu"] for line in open(stage).read().splitlines()[12:])


def test_shards_split_a_study_and_meet_in_its_stage_files(tmp_path):
    """Two processes share a study (``shard``): each fits its datasets into its own stage file, the
    first to finish gets None, the last the study, the same as one process's; a rerun fits nothing."""
    stage = str(tmp_path / "sbc.jsonl")
    whole = study(exact_fit(), datasets=10)
    calls = {0: [], 1: []}
    first = study(exact_fit(calls=calls[0]), datasets=10, stage_path=stage, shard=(0, 2))
    second = study(exact_fit(calls=calls[1]), datasets=10, stage_path=stage, shard=(1, 2))
    assert first is None and calls == {0: [3, 5, 7, 9, 11], 1: [4, 6, 8, 10, 12]}
    np.testing.assert_array_equal(second.ranks, whole.ranks)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sbc-0of2.jsonl", "sbc-1of2.jsonl"]
    again = []
    np.testing.assert_array_equal(study(exact_fit(calls=again), datasets=10, stage_path=stage).ranks, whole.ranks)
    assert again == []
    with pytest.raises(ValueError, match="needs a stage_path"):
        study(exact_fit(), datasets=10, shard=(0, 2))


def test_the_sbc_command_samples_as_the_fit_command_unless_told():
    """SBC checks the posteriors experiments.fit ships (its chains, warm-up, draws and reruns); the
    misspecified study keeps its shorter defaults; a value given is kept."""
    from experiments import calibration, fit

    shipped = fit.parse_args([])
    args = calibration.argparse.Namespace(only="sbc", chains=None, warmup=None, draws=None, reruns=None)
    calibration._sampler_settings(args)
    assert (args.chains, args.warmup, args.draws, args.reruns) == (shipped.chains, shipped.warmup, shipped.draws,
                                                                   shipped.reruns)
    args = calibration.argparse.Namespace(only="misspecified", chains=3, warmup=None, draws=None, reruns=None)
    calibration._sampler_settings(args)
    assert (args.chains, args.warmup, args.draws, args.reruns) == (3, 300, 300, 0)


def test_prior_datasets_names_a_site_the_model_lacks():
    with pytest.raises(ValueError, match=r"no site\(s\) \['sigma'\]"):
        prior_datasets(normal_mean_model, (np.zeros(ROWS),), obs_site="y", sites=("mu", "sigma"), count=2, seed=0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_loss_law_family_simulates_what_its_posterior_ranks(family):
    """The wiring of :func:`loss_law_sbc`: the prior of each family's hierarchical model yields every
    site the study ranks, and log losses of the design's shape, finite."""
    n = np.repeat([2e4, 5e4, 1e5, 3e5], 3)
    d = n * np.tile([5.0, 10.0, 20.0], 4)
    run = np.repeat(np.arange(4), 3).astype(np.int32)
    model, args = loss_law_numpyro_model(FAMILIES[family], n, d, run=run)
    sites = loss_law_sites(FAMILIES[family], run_effects=True)
    truths, data = prior_datasets(model, args, obs_site="log_loss", sites=sites, count=20, seed=0)
    assert set(truths) == set(sites) and data.shape == (20, n.size)
    assert np.isfinite(data).all() and all(np.isfinite(v).all() for v in truths.values())


@pytest.mark.parametrize("name", sorted(ACCEPTANCE_MODELS))
def test_every_acceptance_model_simulates_what_its_posterior_ranks(name):
    """The wiring of :func:`acceptance_sbc`, with per-model effects: every site it ranks, and alphas
    of the design's shape inside [0, 1]."""
    drafts, targets = np.repeat(np.arange(4), 3), np.tile(np.arange(3), 4)
    x, y = 20.0 - 3.0 * drafts, 9.0 - 2.0 * targets
    model, args = acceptance_numpyro_model(ACCEPTANCE_MODELS[name], x, y, draft=drafts.astype(np.int32),
                                           target=targets.astype(np.int32))
    sites = PLANE_SITES + MODEL_EFFECT_SITES
    truths, alpha = prior_datasets(model, args, obs_site="alpha_obs", sites=sites, count=20, seed=0)
    assert set(truths) == set(sites) and alpha.shape == (20, x.size)
    assert ((alpha >= 0) & (alpha <= 1)).all() and all(np.isfinite(v).all() for v in truths.values())


def test_an_acceptance_study_in_data_scaled_coordinates_is_another_study(tmp_path, monkeypatch):
    """The coefficients' coordinates reach the sampler and are part of an acceptance SBC study's key
    where they are not the default, so ranks sampled in one never resume into the other; the
    default's key is as before (the sampler is replaced by one returning prior-free draws: what is
    checked is the wiring, not NUTS)."""
    import types

    import sdsl_jax.infer.posterior as posterior
    from sdsl_jax.validation.calibration import acceptance_sbc

    seen = []

    def sampler(*args, coefficients="prior-scaled", **kw):
        seen.append(coefficients)
        draws = {site: np.linspace(-1.0, 1.0, 99) for site in PLANE_SITES}
        return types.SimpleNamespace(samples=draws, diagnostics=types.SimpleNamespace(problems=()))

    monkeypatch.setattr(posterior, "sample_plane", sampler)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(8, 30, 12), rng.uniform(3, 9, 12)
    keys = {}
    for coefficients in ("data-scaled", "prior-scaled"):
        stage = str(tmp_path / f"{coefficients}.jsonl")
        out = acceptance_sbc(ACCEPTANCE_MODELS["plane"], x, y, datasets=2, keep=9, stage_path=stage,
                             coefficients=coefficients)
        assert out.ranks.shape == (2, len(PLANE_SITES))
        keys[coefficients] = [json.loads(line)["study"] for line in open(stage) if line.strip()]
    assert seen == ["data-scaled"] * 2 + ["prior-scaled"] * 2
    assert all(k.get("coefficients") == "data-scaled" for k in keys["data-scaled"])
    assert all("coefficients" not in k for k in keys["prior-scaled"])


@pytest.mark.slow
def test_loss_law_sbc_runs_nuts_on_a_ladder_design():
    """End to end on a small design (slow: one NUTS compilation; the machinery is covered above)."""
    jax.config.update("jax_enable_x64", True)
    n = np.repeat([2e4, 5e4, 1e5, 3e5], 3)
    d = n * np.tile([5.0, 10.0, 20.0], 4)
    run = np.repeat(np.arange(4), 3).astype(np.int32)
    out = loss_law_sbc(FAMILIES["chinchilla"], n, d, run=run, datasets=3, num_chains=1, num_warmup=100,
                       num_samples=100, keep=9)
    assert out.ranks.shape == (3, len(out.sites)) and out.ranks.min() >= 0 and out.ranks.max() <= 9
    assert len(out.failed_checks) == 3


@pytest.mark.parametrize("args, fragment", [
    (["--only", "sbc"], "--only sbc needs --out DIR"),
    (["--only", "sbc", "--families", "chinchilla,cubic", "--out", "OUT"], "--families: unknown ['cubic']"),
    (["--only", "sbc", "--acceptance-models", "plane,cone", "--out", "OUT"], "--acceptance-models: unknown ['cone']"),
    (["--only", "sbc", "--shard", "2/2", "--out", "OUT"], "--shard: '2/2' is not I/K with 0 <= I < K"),
    (["--only", "sbc", "--chains", "0", "--out", "OUT"], "--chains must be at least 1, got 0"),
    (["--only", "sbc", "--reruns", "-1", "--out", "OUT"], "--reruns must be >= 0, got -1"),
])
def test_the_sbc_command_refuses_what_it_cannot_run(args, fragment, tmp_path, capsys):
    from experiments import calibration

    out = tmp_path / "out"
    assert calibration.main([str(out) if a == "OUT" else a for a in args]) == 2
    assert fragment in capsys.readouterr().err
    assert not out.exists()


def test_the_one_break_laws_simulated_breaks_lie_inside_the_designs_span_of_d():
    """The break the data can say something about: every prior draw of the one-break law's break
    lies between the design's smallest and largest D."""
    from sdsl_jax.loss_laws import BROKEN_POWER_LAW

    n = np.repeat([2e4, 5e4, 1e5, 3e5], 6)
    d = np.tile(np.geomspace(6e5, 1e7, 6), 4)
    model, args = loss_law_numpyro_model(BROKEN_POWER_LAW, n, d)
    truths, _ = prior_datasets(model, args, obs_site="log_loss", sites=("log_d_break",), count=400, seed=0)
    breaks = truths["log_d_break"]
    assert (breaks > np.log(6e5)).all() and (breaks < np.log(1e7)).all()
    assert breaks.min() < np.log(6e5) + 0.5 and breaks.max() > np.log(1e7) - 0.5  # the whole span, not its middle


def test_a_study_under_a_revised_prior_is_another_study():
    """An SBC study's key names the priors and their sampling coordinates (``prior_key``): a revised
    family's key (the one-break law's, Chinchilla's) stands apart from an unrevised one's, and the
    exponents' prior enters only the keys of families that use it."""
    from sdsl_jax.loss_laws import BROKEN_POWER_LAW, CHINCHILLA, DATA_ONLY, EXPONENT_PRIOR, KAPLAN, prior_key
    from sdsl_jax.validation.calibration import _sampler_study

    settings = dict(num_chains=4, num_warmup=500, num_samples=500, retries=2, target_accept=0.9)
    assert KAPLAN.prior_revision == 0 and prior_key([KAPLAN]) == {} and prior_key([]) == {}
    assert prior_key([KAPLAN, DATA_ONLY])["exponent_prior"] == list(EXPONENT_PRIOR)
    broken, chinchilla = (_sampler_study(**settings, families=(f,)) for f in (BROKEN_POWER_LAW, CHINCHILLA))
    assert broken != chinchilla and broken["prior_revisions"] == {"broken": BROKEN_POWER_LAW.prior_revision}
    assert chinchilla["prior_revisions"] == {"chinchilla": CHINCHILLA.prior_revision}
    assert chinchilla["exponent_prior"] == list(EXPONENT_PRIOR)


def test_a_study_sampled_at_another_target_acceptance_is_another_study(tmp_path, monkeypatch):
    """NUTS's target acceptance is part of an SBC study's key: the stage lines of a study sampled at
    a family's former target acceptance are not resumed as the current one's, and the shipped SBC
    functions key by the target acceptance they sample at (the family's; the acceptance model's with
    per-model effects, 0.9 without)."""
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.infer.posterior import plane_target_accept
    from sdsl_jax.loss_laws import BROKEN_POWER_LAW
    from sdsl_jax.validation.calibration import _sampler_study

    settings = dict(num_chains=4, num_warmup=500, num_samples=500, retries=2, families=(BROKEN_POWER_LAW,))
    former, current = (_sampler_study(**settings, target_accept=a) for a in (0.99, 0.95))
    stage = str(tmp_path / "sbc.jsonl")
    calls = []
    study(exact_fit(calls=calls), datasets=6, stage_path=stage, study=former)
    study(exact_fit(calls=calls), datasets=6, stage_path=stage, study=current)
    assert len(calls) == 12  # nothing resumed across target acceptances
    study(exact_fit(calls=calls), datasets=6, stage_path=stage, study=current)
    assert len(calls) == 12  # the same study resumes whole
    logit = ACCEPTANCE_MODELS["logit-plane"]
    assert plane_target_accept(logit, effects=True) == logit.effects_target_accept != 0.9
    assert plane_target_accept(logit, effects=False) == 0.9

    import sdsl_jax.validation.calibration as calibration
    from sdsl_jax.data import load_pretraining

    keys = []
    monkeypatch.setattr(calibration, "simulation_based_calibration", lambda *a, study, **kw: keys.append(study))
    runs = load_pretraining("fits/ladder-v1/pretraining.csv")
    calibration.loss_law_sbc(BROKEN_POWER_LAW, runs.n_params, runs.n_tokens, run=runs.run_index()[0], datasets=2)
    ppl = np.linspace(10.0, 30.0, 8)
    model = np.repeat(np.arange(4), 2)
    calibration.acceptance_sbc(logit, ppl, ppl[::-1], draft=model, target=model, datasets=2)
    calibration.acceptance_sbc(logit, ppl, ppl[::-1], datasets=2)
    assert [k["target_accept"] for k in keys] == [BROKEN_POWER_LAW.target_accept, logit.effects_target_accept, 0.9]


def test_a_prior_a_model_does_not_use_never_sets_its_studies_apart(tmp_path):
    """Stage lines keyed with an exponents' prior resume a study whose models do not use that
    prior (Kaplan's law, an acceptance model: their keys once named it all the same), whichever
    prior they name; for a family that uses it, a line under another exponents' prior is another
    study's."""
    from sdsl_jax.loss_laws import CHINCHILLA, KAPLAN, same_prior_key
    from sdsl_jax.validation.calibration import _sampler_study

    settings = dict(num_chains=4, num_warmup=500, num_samples=500, retries=2, target_accept=0.9)
    kaplan, acceptance, chinchilla = (_sampler_study(**settings, families=f) for f in ((KAPLAN,), (), (CHINCHILLA,)))
    old_prior = ["lognormal", -1.0498221244986778, 1.0]
    for current in (kaplan, acceptance):
        assert same_prior_key(dict(current, exponent_prior=old_prior), current)
        assert not same_prior_key(dict(current, chains=2, exponent_prior=old_prior), current)
    assert same_prior_key(chinchilla, chinchilla) and not same_prior_key(dict(chinchilla, exponent_prior=old_prior),
                                                                         chinchilla)
    assert same_prior_key(None, None) and not same_prior_key(None, kaplan)

    stage = str(tmp_path / "sbc.jsonl")
    calls = []
    study(exact_fit(calls=calls), datasets=6, stage_path=stage, study=dict(kaplan, exponent_prior=old_prior))
    study(exact_fit(calls=calls), datasets=6, stage_path=stage, study=kaplan)
    assert len(calls) == 6  # resumed whole
    study(exact_fit(calls=calls), datasets=6, stage_path=stage, study=dict(chinchilla, exponent_prior=old_prior))
    study(exact_fit(calls=calls), datasets=6, stage_path=stage, study=chinchilla)
    assert len(calls) == 18  # fitted again under the exponents' prior it uses


def test_a_run_of_some_families_never_writes_over_the_whole_studys_summary():
    """``--families data`` once rewrote ``sbc.json`` with the data-only law alone, dropping the other
    families' results: a partial run names its own summary."""
    from experiments.calibration import _sbc_name
    from sdsl_jax.loss_laws import FAMILIES

    assert _sbc_name(list(FAMILIES), ["plane"]) == "sbc"
    assert _sbc_name(["data"], ["plane"]) == "sbc-data-acceptance-plane"
    assert _sbc_name([], ["plane", "log-plane"]) == "sbc-acceptance-plane-acceptance-log-plane"
