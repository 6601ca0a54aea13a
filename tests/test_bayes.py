"""Posteriors: recovery, diagnostics that can fail, propagation to N* bands, calibration."""

import contextlib

import numpy as np
import pytest

from sdsl_jax import HOFFMANN2022, SDSL2026, AcceptancePlane, LossLaw, optimal_draft_size
from sdsl_jax.infer import check_diagnostics, sample_plane
from sdsl_jax.predict import plane_sensitivity, propagate_draft_size

az = pytest.importorskip("arviz")


def test_plane_posterior_recovers_truth_and_passes_diagnostics():
    rng = np.random.default_rng(3)
    x, y = rng.uniform(5, 60, 60), rng.uniform(3, 20, 60)
    alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.02, 60)
    run = sample_plane(x, y, alpha, num_chains=4, num_warmup=500, num_samples=500, progress_bar=False, seed=1)
    assert run.diagnostics.ok, run.diagnostics.problems
    for k in ("A", "B", "C"):
        lo, hi = np.quantile(run.samples[k], [0.005, 0.995])
        assert lo <= getattr(SDSL2026, k) <= hi, k
    assert run.inference_data.posterior["A"].shape == (4, 500)
    # A well-scaled 4-parameter posterior: a few leapfrog steps per draw, none at the tree-depth cap.
    assert 1 <= run.diagnostics.mean_steps < 64 and run.diagnostics.max_tree_depth_share == 0.0


def test_diagnostics_flag_disagreeing_chains_and_divergences():
    rng = np.random.default_rng(0)
    draws = np.stack([rng.normal(0, 1, 500), rng.normal(3, 1, 500)])  # two chains, different modes
    idata = az.from_dict(posterior={"theta": draws})
    bad = check_diagnostics(idata, 0, var_names=["theta"])
    assert not bad.ok and any("R-hat" in p for p in bad.problems)
    good = az.from_dict(posterior={"theta": rng.normal(0, 1, (4, 1000))})
    assert check_diagnostics(good, 0, var_names=["theta"]).ok
    assert not check_diagnostics(good, 3, var_names=["theta"]).ok
    # The sampler's geometry: mean leapfrog steps per draw and the share of draws at the depth cap.
    steps = np.array([[3, 7, 1023, 15], [1023, 1023, 7, 3]])
    geometry = check_diagnostics(good, 0, var_names=["theta"], num_steps=steps, max_tree_depth=10)
    assert geometry.mean_steps == pytest.approx(steps.mean()) and geometry.max_tree_depth_share == 3 / 8
    assert geometry.median_steps == pytest.approx(np.median(steps))
    assert not geometry.ok and any("maximum tree depth" in p for p in geometry.problems)
    assert np.isnan(check_diagnostics(good, 0, var_names=["theta"]).mean_steps)
    one_in_200 = np.full((2, 100), 7)
    one_in_200[0, 0] = 1023  # 0.5% at the cap passes
    assert check_diagnostics(good, 0, var_names=["theta"], num_steps=one_in_200, max_tree_depth=10).ok


def test_bulk_ess_threshold_is_100_per_chain():
    # AR(1) chains with phi = 0.8 have ESS ~ n (1 - phi) / (1 + phi) = n / 9 per chain: 2 chains of
    # 2,000 draws give ~440 in all, above the 200 that two chains need;
    # 4 chains of 500 draws give ~220, below the 400 that four chains need.
    rng = np.random.default_rng(1)

    def ar1(chains, n, phi=0.8):
        x = np.zeros((chains, n))
        noise = rng.normal(0, np.sqrt(1 - phi**2), (chains, n))
        x[:, 0] = rng.normal(0, 1, chains)
        for t in range(1, n):
            x[:, t] = phi * x[:, t - 1] + noise[:, t]
        return az.from_dict(posterior={"theta": x})

    two = check_diagnostics(ar1(2, 2000), 0, var_names=["theta"])
    assert two.min_ess_bulk > 200 and two.ok, two.problems
    four = check_diagnostics(ar1(4, 500), 0, var_names=["theta"])
    assert four.min_ess_bulk < 400 and not four.ok
    assert any("<= 400" in p for p in four.problems)
    assert not check_diagnostics(ar1(2, 2000), 0, var_names=["theta"], min_ess=1e4).ok


def test_chains_start_from_dispersed_prior_draws_not_at_one_point():
    import jax.numpy as jnp

    from sdsl_jax.infer import loss_law_model, prior_starts
    from sdsl_jax.loss_laws import EXPONENT_PRIOR, _level_and_slopes

    n, d = np.repeat([1e8, 3e8, 1e9], 3), np.tile([1e9, 1e10, 1e11], 3)
    log_loss = jnp.log(jnp.asarray(HOFFMANN2022.loss(n, d)))
    args = (jnp.log(jnp.asarray(n)), jnp.log(jnp.asarray(d)), log_loss)
    starts = prior_starts(loss_law_model, args, 8, seed=0)
    # Spread like the prior, in unconstrained coordinates: logit((alpha - low) / (high - low)) of a
    # uniform alpha is standard logistic (sd pi / sqrt(3)), and, mapped back from the sampled
    # coordinates, a_ref ~ Normal(-1, 2).
    _, low, high = EXPONENT_PRIOR
    logistic_sd = np.pi / np.sqrt(3)
    assert 0.4 * logistic_sd < np.std(np.asarray(starts["alpha"])) < 2.0 * logistic_sd
    alpha, beta = (low + (high - low) / (1 + np.exp(-np.asarray(starts[k]))) for k in ("alpha", "beta"))
    stated = _level_and_slopes(alpha, beta).inv(starts["level_and_slopes"])  # e, a_ref, b_ref
    assert 1.0 < np.std(np.asarray(stated[:, 1])) < 4.0
    again = prior_starts(loss_law_model, args, 8, seed=0)
    np.testing.assert_array_equal(np.asarray(starts["level_and_slopes"]), np.asarray(again["level_and_slopes"]))
    assert np.shape(prior_starts(loss_law_model, args, 1, seed=0)["level_and_slopes"]) == (3,)  # one chain: unbatched


def test_widened_priors_double_every_spread_and_leave_locations_and_plates_alone():
    import jax.numpy as jnp
    import numpyro.distributions as dist
    from numpyro import handlers

    from sdsl_jax.infer import loss_law_model, run_effects_model_for, widened_priors
    from sdsl_jax.loss_laws import CHINCHILLA

    n, d = np.repeat([1e8, 3e8, 1e9], 2), np.tile([1e9, 1e10], 3)
    args = (jnp.log(jnp.asarray(n)), jnp.log(jnp.asarray(d)), jnp.zeros(6, jnp.int32),
            jnp.zeros(1))

    def sites(model):
        trace = handlers.trace(handlers.seed(model, 0)).get_trace(*args, jnp.log(jnp.asarray(HOFFMANN2022.loss(n, d))))
        return {k: v["fn"] for k, v in trace.items() if v["type"] == "sample"}, trace["sigma"]["value"]

    model = run_effects_model_for(CHINCHILLA)
    (plain, _), (wide, wide_sigma) = sites(model), sites(widened_priors(model, 2.0))
    assert plain.keys() == wide.keys()
    for name in ("sigma", "run_sd"):
        assert float(wide[name].scale) == pytest.approx(2 * float(plain[name].scale)), name
    # The exponents' Uniform(0, 2): the lower bound kept, the width doubled.
    for name in ("alpha", "beta"):
        assert (float(wide[name].low), float(wide[name].high)) == (0.0, 4.0), name
        assert (float(plain[name].low), float(plain[name].high)) == (0.0, 2.0), name
    # (e, a_ref, b_ref): sampled in other coordinates, their stated prior widened, the coordinates kept.
    stated, wide_stated = plain["level_and_slopes"].base_dist, wide["level_and_slopes"].base_dist
    np.testing.assert_allclose(wide_stated.base_dist.scale, 2 * stated.base_dist.scale)
    np.testing.assert_array_equal(wide_stated.base_dist.loc, stated.base_dist.loc)
    kinds = [[type(t) for t in sites_["level_and_slopes"].transforms] for sites_ in (plain, wide)]
    assert kinds[0] == kinds[1]
    # nu - 1 ~ Gamma: the mean kept, the sd doubled.
    assert float(wide["nu_excess"].mean) == pytest.approx(float(plain["nu_excess"].mean))
    assert float(wide["nu_excess"].variance) == pytest.approx(4 * float(plain["nu_excess"].variance))
    # Per-run effects (standard units, inside a plate) and the likelihood are untouched.
    assert wide["run_z"] is not None and float(wide["run_z"].variance.max()) == 1.0
    np.testing.assert_allclose(wide["log_loss"].scale, wide_sigma)
    assert widened_priors(model, 2.0) is widened_priors(model, 2.0) and widened_priors(model, 1.0) is model

    def odd_prior():
        import numpyro
        numpyro.sample("u", dist.Beta(2.0, 2.0))

    with pytest.raises(ValueError, match="site 'u': cannot widen a Beta"):
        handlers.trace(handlers.seed(widened_priors(odd_prior, 2.0), 0)).get_trace()
    with pytest.raises(ValueError, match="must be positive"):
        widened_priors(loss_law_model, 0.0)


def test_a_run_that_fails_its_checks_runs_again_longer_from_new_starts():
    from sdsl_jax.infer import Diagnostics, PosteriorRun, rerun_until_checked

    calls = []

    def attempt(warmup, draws, accept, seed):
        calls.append((warmup, draws, accept, seed))
        ok = len(calls) == 2
        return PosteriorRun({}, None, Diagnostics(1.0 if ok else 1.2, 500.0, 0, ok, () if ok else ("R-hat",)))

    out = rerun_until_checked(attempt, num_warmup=500, num_samples=400, target_accept=0.9, seed=3, retries=2)
    assert out.diagnostics.ok and out.diagnostics.attempts == 2
    assert calls[0] == (500, 400, 0.9, 3)
    assert calls[1][:3] == (1000, 800, pytest.approx(0.95)) and calls[1][3] != 3

    def failing(*_):
        return PosteriorRun({}, None, Diagnostics(1.2, 500.0, 0, False, ("R-hat",)))

    assert rerun_until_checked(failing, num_warmup=10, num_samples=10, target_accept=0.9, seed=0,
                               retries=0).diagnostics.attempts == 1
    still = rerun_until_checked(failing, num_warmup=10, num_samples=10, target_accept=0.9, seed=0, retries=2)
    assert still.diagnostics.attempts == 3 and not still.diagnostics.ok  # the last run, failed, is returned


@pytest.mark.parametrize("one_piece_below_s", [0.0, float("inf")])
def test_progress_reports_warm_up_and_draws_and_changes_no_draw(one_piece_below_s, monkeypatch):
    from sdsl_jax.infer import sampler

    # Draws expected to be long run in pieces, each reported; short ones in one piece.
    monkeypatch.setattr(sampler, "ONE_PIECE_BELOW_S", one_piece_below_s)
    rng = np.random.default_rng(3)
    x, y = rng.uniform(5, 60, 40), rng.uniform(3, 20, 40)
    alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.02, 40)
    kw = dict(num_chains=2, num_warmup=50, num_samples=100, progress_bar=False, seed=4, retries=0)
    lines = []
    pieces = sample_plane(x, y, alpha, progress=lines.append, **kw)
    whole = sample_plane(x, y, alpha, **kw)
    for k in whole.samples:
        np.testing.assert_array_equal(pieces.samples[k], whole.samples[k])
    assert pieces.diagnostics == whole.diagnostics
    assert lines[0].startswith("warm-up: 2 chains x 50 iterations") and "draws 0/100" in lines[1]
    reported = [k for k in range(20, 101, 20)] if one_piece_below_s == 0 else [100]
    assert [line.split(" per chain")[0] for line in lines[2:]] == [f"draws {k}/100" for k in reported]
    assert all("s left" in line for line in lines[3:-1]) and "left" not in lines[-1]
    if one_piece_below_s:  # the cached sampler ran the draws whole: it keeps its piece length for the next run
        monkeypatch.setattr(sampler, "ONE_PIECE_BELOW_S", 0.0)
        lines = []
        again = sample_plane(x, y, alpha, progress=lines.append, **kw)
        assert [line.split(" per chain")[0] for line in lines[2:]] == [f"draws {k}/100" for k in range(20, 101, 20)]
        np.testing.assert_array_equal(again.samples["A"], whole.samples["A"])


def test_propagation_of_identical_draws_collapses_to_the_point_solution():
    m = np.array([1e10, 5e10, 1e11])
    laws = LossLaw(*(np.full(7, v) for v in HOFFMANN2022))
    bands = propagate_draft_size(m, laws, SDSL2026, d_draft=1e12, d_target=1e12, chunk_size=3)
    point = np.asarray(optimal_draft_size(m, d_draft=1e12, d_target=1e12))
    np.testing.assert_allclose(bands.n_star, np.broadcast_to(point, bands.n_star.shape), rtol=1e-12)
    np.testing.assert_allclose(bands.m_over_n[2], m / point, rtol=1e-12)
    assert np.all(bands.failed_fraction == 0) and bands.n_star_draws.shape == (7, 3)


def test_propagation_bands_are_ordered_and_chunking_does_not_matter():
    rng = np.random.default_rng(0)
    laws = LossLaw(*(np.asarray(v) * (1 + 0.01 * rng.standard_normal(50)) for v in HOFFMANN2022))
    m = np.linspace(1e10, 1.1e11, 6)
    a = propagate_draft_size(m, laws, SDSL2026, d_draft=1e12, d_target=1e12, chunk_size=8)
    b = propagate_draft_size(m, laws, SDSL2026, d_draft=1e12, d_target=1e12, chunk_size=64)
    np.testing.assert_allclose(a.n_star, b.n_star, rtol=1e-12)
    assert np.all(np.diff(a.n_star, axis=0) >= 0) and np.all(np.diff(a.n_star[2]) > 0)
    assert np.all(np.isfinite(a.linear_law.mu)) and a.linear_law.mu.shape == (50,)


def test_failed_draws_are_counted_not_hidden():
    planes = AcceptancePlane(A=np.array([-0.0067, -0.0067]), B=np.array([0.01297, 0.01297]), C=np.array([0.642, -5.0]))
    bands = propagate_draft_size([5e10], HOFFMANN2022, planes, d_draft=1e12, d_target=1e12)
    assert bands.failed_fraction[0] == 0.5


def test_plane_sensitivity_matches_finite_differences():
    m = np.array([3e10])
    sens = plane_sensitivity(m, law=HOFFMANN2022, plane=SDSL2026, d_draft=1e12, d_target=1e12)
    h = 1e-4
    for k in ("A", "B", "C"):
        up = SDSL2026._replace(**{k: getattr(SDSL2026, k) * (1 + h)})
        dn = SDSL2026._replace(**{k: getattr(SDSL2026, k) * (1 - h)})
        fd = (np.log(optimal_draft_size(m, d_draft=1e12, d_target=1e12, plane=up))
              - np.log(optimal_draft_size(m, d_draft=1e12, d_target=1e12, plane=dn))) / (2 * h)
        assert sens[k][0] == pytest.approx(float(fd[0]), rel=1e-5, abs=1e-8), k


def test_a_second_run_on_same_shaped_data_compiles_nothing_and_draws_as_numpyro_does():
    """The sampling loop is compiled once per model and data shape (NumPyro alone compiles it on
    every run); the draws are those of NumPyro's own loop, bit for bit."""
    import jax

    from sdsl_jax import infer
    from sdsl_jax.infer import sampler

    rng = np.random.default_rng(3)

    def data():
        x, y = rng.uniform(5, 60, 30), rng.uniform(3, 20, 30)
        return x, y, SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.03, 30)

    kw = dict(num_chains=1, num_warmup=40, num_samples=40, progress_bar=False, summarize=False)
    infer.sample_plane(*data(), seed=0, **kw)  # compiles
    second = data()
    compiled = []

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        reused = infer.sample_plane(*second, seed=1, **kw)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiled == []
    # The same run with NumPyro's own (recompiling) loop.
    sampler._mcmc.cache_clear()
    original = sampler._sampling_loop_compiled_once
    sampler._sampling_loop_compiled_once = contextlib.nullcontext
    try:
        plain = infer.sample_plane(*second, seed=1, **kw)
    finally:
        sampler._sampling_loop_compiled_once = original
    for site in ("A", "B", "C", "sigma"):
        np.testing.assert_array_equal(reused.samples[site], plain.samples[site])


def test_vectorised_chains_initialised_again_map_the_sampling_function_once():
    """NumPyro's HMC maps its sampling function once more each time vectorised chains start: a cached
    sampler initialised twice holds a twice-mapped function, which fails once its loop is traced
    again. The sampler's kernel starts each initialisation from the unmapped function. (End to end,
    with the loop traced again: the slow test below.)"""
    import jax
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import NUTS

    from sdsl_jax.infer.sampler import _ReinitialisableNUTS

    def model():
        numpyro.sample("x", dist.Normal())

    def vmap_depth(kernel):
        kernel.init(keys, 5)
        kernel.init(keys, 5)
        f, depth = kernel._sample_fn, 0
        while hasattr(f, "__wrapped__"):
            f, depth = f.__wrapped__, depth + 1
        return depth

    keys = jax.random.split(jax.random.PRNGKey(0), 2)  # a key per chain: vectorised chains
    assert vmap_depth(NUTS(model)) == 2  # what NumPyro does
    assert vmap_depth(_ReinitialisableNUTS(model)) == 1


@pytest.mark.slow  # two compilations of a vectorised sampler; the fast test above checks the mechanism
def test_a_cached_sampler_with_vectorised_chains_runs_again_after_its_program_left_the_caches():
    """NumPyro's HMC maps its sampling function once more each time vectorised chains start; the
    cached sampler starts each run from the unmapped function, so a run traced again (its program
    evicted, or JAX's caches cleared) does not fail on a twice-mapped function."""
    import jax

    from sdsl_jax import infer
    from sdsl_jax.infer import sampler

    chains = jax.local_device_count() + 1  # more chains than devices: vectorised
    assert sampler._chain_method(chains) == "vectorized"
    rng = np.random.default_rng(5)
    x, y = rng.uniform(5, 60, 30), rng.uniform(3, 20, 30)
    alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.03, 30)
    kw = dict(num_chains=chains, num_warmup=30, num_samples=30, progress_bar=False, summarize=False)
    for seed in range(2):
        run = infer.sample_plane(x, y, alpha, seed=seed, **kw)
        assert run.samples["A"].shape == (chains * 30,) and np.isfinite(run.samples["A"]).all()
        jax.clear_caches()


def test_a_cached_sampler_is_keyed_on_the_data_shapes():
    """An MCMC object holds state traced for one set of shapes (vectorised chains fail on another),
    so the sampler cache gives each model and shapes its own. The end-to-end run on two shapes with
    vectorised chains is `test_user_data.py::test_a_sampler_runs_again_on_data_of_another_shape` (slow)."""
    from sdsl_jax.infer import plane_model, sampler

    def mcmc(rows):
        shapes = (((rows,), "float64"),)
        return sampler._mcmc(plane_model, 5, 5, 10, False, 0.9, False, shapes)

    assert mcmc(20) is mcmc(20) and mcmc(20) is not mcmc(31)
    assert mcmc(20).num_chains == 5 and mcmc(20).chain_method == sampler._chain_method(5)


def test_compiled_programs_are_released_before_the_kernel_runs_out_of_memory_mappings(monkeypatch):
    """A long job (a stacked closure) compiles thousands of programs; XLA maps memory for each, and
    past Linux's vm.max_map_count LLVM fails and the process dies. Before each NUTS run the caches
    are dropped once the process holds more than three quarters of the mappings allowed, and kept
    below that: a closure's programs (about 27,000 mappings) are reused by the next closure."""
    from sdsl_jax.infer import sampler

    use = sampler._memory_map_use()
    assert use is None or 0 < use[0] < use[1]  # Linux: (this process's mappings, the limit)
    cleared = []
    monkeypatch.setattr(sampler, "clear_sampler_caches", lambda: cleared.append(1))
    monkeypatch.setattr(sampler, "_available_memory_share", lambda: 0.5)  # the machine's memory is not short
    monkeypatch.setattr(sampler, "_memory_map_use", lambda: (50_000, 65_530))
    assert sampler.release_compiled_programs_when_crowded() and cleared == [1]
    monkeypatch.setattr(sampler, "_memory_map_use", lambda: (30_000, 65_530))
    assert not sampler.release_compiled_programs_when_crowded() and cleared == [1]
    monkeypatch.setattr(sampler, "_memory_map_use", lambda: None)  # not Linux: nothing to watch
    assert not sampler.release_compiled_programs_when_crowded()


def test_compiled_programs_are_released_when_the_machine_runs_low_on_memory(monkeypatch):
    """Shards of a study share one machine and each keeps its compiled programs: under a fifth of
    the machine's memory left, a process drops its caches at the next NUTS run, whatever its
    mappings; with more left, or where the share cannot be read, it keeps them."""
    from sdsl_jax.infer import sampler

    share = sampler._available_memory_share()
    assert share is None or 0 < share <= 1
    cleared = []
    monkeypatch.setattr(sampler, "clear_sampler_caches", lambda: cleared.append(1))
    monkeypatch.setattr(sampler, "_memory_map_use", lambda: (1_000, 65_530))
    monkeypatch.setattr(sampler, "_available_memory_share", lambda: 0.1)
    assert sampler.release_compiled_programs_when_crowded() and cleared == [1]
    monkeypatch.setattr(sampler, "_available_memory_share", lambda: 0.5)
    assert not sampler.release_compiled_programs_when_crowded() and cleared == [1]
    monkeypatch.setattr(sampler, "_available_memory_share", lambda: None)
    assert not sampler.release_compiled_programs_when_crowded() and cleared == [1]



def _capture_target_accept(monkeypatch, posterior) -> list:
    """The target acceptance each sampling call would use, in order (the call raises instead of sampling)."""
    seen = []

    def capture(model, args, **kw):
        seen.append(kw["target_accept"])
        raise RuntimeError("captured")

    monkeypatch.setattr(posterior, "_sample_checked", capture)
    return seen


def test_each_loss_law_family_samples_at_its_own_target_acceptance(monkeypatch):
    # The one-break law's sharp break needs smaller steps than the others (docs/benchmarks.md);
    # an explicit target acceptance still wins.
    from sdsl_jax.infer import posterior
    from sdsl_jax.loss_laws import BROKEN_POWER_LAW, CHINCHILLA

    seen = _capture_target_accept(monkeypatch, posterior)
    n, d, loss = np.geomspace(1e6, 1e9, 8), np.geomspace(1e8, 1e11, 8), np.linspace(3.0, 2.0, 8)
    for family, accept in ((CHINCHILLA, None), (BROKEN_POWER_LAW, None), (BROKEN_POWER_LAW, 0.8)):
        with pytest.raises(RuntimeError, match="captured"):
            posterior.sample_loss_law(n, d, loss, family=family, target_accept=accept)
    assert seen == [0.9, 0.99, 0.8]


def test_each_acceptance_model_samples_its_effects_at_its_own_target_acceptance(monkeypatch):
    # The logit-plane's effects need smaller steps than the planes' (docs/benchmarks.md); without
    # effects every model samples at 0.9, and an explicit target acceptance still wins.
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.infer import posterior

    seen = _capture_target_accept(monkeypatch, posterior)
    x, y = np.linspace(10.0, 30.0, 12), np.tile([5.0, 8.0, 11.0], 4)
    groups = dict(draft=np.repeat(np.arange(4), 3), target=np.tile(np.arange(3), 4))
    for name, kw in (("plane", groups), ("log-plane", groups), ("logit-plane", groups), ("logit-plane", {}),
                     ("plane", dict(groups, target_accept=0.8))):
        with pytest.raises(RuntimeError, match="captured"):
            posterior.sample_plane(x, y, np.full(12, 0.6), model=ACCEPTANCE_MODELS[name], **kw)
    assert seen == [0.9, 0.9, 0.99, 0.9, 0.8]


@pytest.mark.parametrize("family_name, terms, exponents", [
    ("chinchilla", ("a_ref", "b_ref"), ("alpha", "beta")),
    ("data", ("b_ref",), ("beta",)),
])
def test_the_terms_sampled_in_level_and_slope_coordinates_keep_the_stated_prior(family_name, terms, exponents):
    """NUTS samples (e, a_ref, b_ref) (the data-only law: (e, b_ref)) as the log loss at the centre and
    the terms' log slopes relative to E; the prior density must still be the stated Normal(0.5, 1) for e
    and Normal(-1, 2) for each term at every point (a unit Jacobian), checked against SciPy's
    densities, and prior draws must follow it."""
    import jax
    import numpyro
    from scipy import stats

    from sdsl_jax.loss_laws import EXPONENT_PRIOR, FAMILIES, DataCentre

    family = FAMILIES[family_name]
    centre = DataCentre.of(np.log([1e5, 1e7]), np.log([1e8, 1e10]))
    exponent = stats.uniform(loc=EXPONENT_PRIOR[1], scale=EXPONENT_PRIOR[2] - EXPONENT_PRIOR[1])
    stated_normals = dict(e=stats.norm(0.5, 1.0), **{t: stats.norm(-1.0, 2.0) for t in terms})
    for seed in range(5):
        trace = numpyro.handlers.trace(numpyro.handlers.seed(family.prior, seed)).get_trace(centre)
        log_density = sum(float(site["fn"].log_prob(site["value"])) for site in trace.values()
                          if site["type"] == "sample")
        value = {k: float(trace[k]["value"]) for k in ("e", *terms, *exponents)}
        stated = (sum(d.logpdf(value[k]) for k, d in stated_normals.items())
                  + sum(exponent.logpdf(value[k]) for k in exponents))
        assert log_density == pytest.approx(stated, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(float(trace["b"]["value"]), value["b_ref"] + value["beta"] * centre.log_d,
                                   rtol=1e-12)
        # What makes the density above the density of the sampled coordinates: the map's Jacobian
        # determinant is 1 (by autodiff, at this draw's point).
        transform = trace["level_and_slopes"]["fn"].transforms[0]
        x = jax.numpy.array([value["e"], *(value[t] for t in terms)])
        assert float(jax.numpy.linalg.det(jax.jacfwd(transform)(x))) == pytest.approx(1.0, rel=1e-12)
        np.testing.assert_allclose(transform.inv(transform(x)), x, rtol=1e-12, atol=1e-12)
        y = np.asarray(transform(x))
        assert y[0] == pytest.approx(np.logaddexp.reduce(np.asarray(x)), rel=1e-12)
        np.testing.assert_allclose(y[1:], [value[t] - value["e"] + np.log(value[k]) for t, k in zip(terms, exponents)],
                                   rtol=1e-12, atol=1e-12)
    draws = numpyro.infer.Predictive(family.prior, num_samples=4000, parallel=True)(jax.random.PRNGKey(1), centre)
    for name, normal in stated_normals.items():
        assert stats.kstest(np.asarray(draws[name]), normal.cdf).pvalue > 1e-3, name


def test_the_one_break_law_keeps_its_stated_prior_in_the_coordinates_nuts_samples():
    """The one-break law is sampled with the slope after its break and the D term as the data see it
    at their centre (break included); the prior density must stay the stated one at every point
    (SciPy's densities of each stated parameter), the sampled coordinates must be those quantities
    (computed here from the law itself), and prior draws must follow the stated priors."""
    import jax
    import numpyro
    from scipy import stats

    from sdsl_jax.loss_laws import BROKEN_POWER_LAW, EXPONENT_PRIOR, DataCentre

    centre = DataCentre.of(np.log([2e4, 1e6]), np.log([1e5, 3e5, 1e7]))
    exponent = stats.uniform(loc=EXPONENT_PRIOR[1], scale=EXPONENT_PRIOR[2] - EXPONENT_PRIOR[1])
    stated = dict(e=stats.norm(0.5, 1.0), a_ref=stats.norm(-1.0, 2.0), b_ref=stats.norm(-1.0, 2.0),
                  break_logit=stats.norm(0.0, 1.5), c=stats.norm(0.0, 1.0), log_f=stats.norm(0.0, 1.0))
    for seed in range(5):
        trace = numpyro.handlers.trace(numpyro.handlers.seed(BROKEN_POWER_LAW.prior, seed)).get_trace(centre)
        log_density = sum(float(site["fn"].log_prob(site["value"])) for site in trace.values()
                          if site["type"] == "sample")
        v = {k: float(np.asarray(trace[k]["value"])) for k in (*stated, "alpha", "beta", "b", "log_d_break")}
        expected = (sum(d.logpdf(v[k]) for k, d in stated.items())
                    + sum(exponent.logpdf(v[k]) for k in ("alpha", "beta")))
        assert log_density == pytest.approx(expected, rel=1e-12, abs=1e-12)
        slope_after = float(trace["slope_after_break"]["value"])
        assert slope_after == pytest.approx(v["beta"] + v["c"], rel=1e-12, abs=1e-12)
        # The third sampled coordinate: log of the D term at the centre relative to E, times beta.
        law = BROKEN_POWER_LAW.from_theta(np.array([v["a_ref"], v["b"], v["e"], v["alpha"], v["beta"],
                                                    v["log_d_break"], v["c"], v["log_f"]]))
        d_ref = np.exp(float(centre.log_d))
        d_term = law.B * d_ref ** -law.beta * (1 + (d_ref / law.D_break) ** (1 / law.f)) ** (-law.c * law.f)
        y = np.asarray(trace["level_and_slopes"]["value"])
        assert y[2] == pytest.approx(np.log(float(d_term)) - v["e"] + np.log(v["beta"]), rel=1e-10, abs=1e-10)
    draws = numpyro.infer.Predictive(BROKEN_POWER_LAW.prior, num_samples=4000, parallel=True)(
        jax.random.PRNGKey(1), centre)
    for name, normal in stated.items():
        assert stats.kstest(np.asarray(draws[name]), normal.cdf).pvalue > 1e-3, name
