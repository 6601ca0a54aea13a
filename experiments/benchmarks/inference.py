"""Benchmarks of the fits: the multi-start loss-law fit against SciPy, the calibration of posterior
intervals, and NUTS with its sampling loop compiled once against NumPyro's own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import jax
import numpy as np

from experiments import numpy_reference
from experiments.benchmarks.numerics import median_time


REACHED = 1e-9
"""A start reaches the optimum when its objective is within this relative distance of the best one found."""


def reached_share(values, best: float) -> float:
    """The share of starts whose objective is within :data:`REACHED` of ``best`` (relative)."""
    values = np.asarray(values, np.float64)
    return float(np.mean(np.isfinite(values) & (values <= best * (1 + REACHED))))


def bench_loss_law_fit(scipy_starts: int, repeats: int) -> list[dict]:
    """The 4,500-start fit against SciPy's L-BFGS-B on a random subset of the same starts: time per
    start (medians for both sides) and the share of starts that reach the best objective either side
    found, so that fast starts that stop early do not pass for equal work."""
    from sdsl_jax.data import load_pretraining
    from sdsl_jax.infer.point import EPOCH_GRID, fit_loss_law

    runs = load_pretraining("fits/data/chinchilla_fig4.csv")
    runs = runs.select(np.sort(np.argsort(runs.loss)[:-5]))
    start = time.perf_counter()
    fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss)
    first_s = time.perf_counter() - start
    t_jax = median_time(lambda: jax.block_until_ready(fit_loss_law(runs.n_params, runs.n_tokens, runs.loss)),
                        max(1, repeats // 2))
    subset = np.random.default_rng(0).choice(len(EPOCH_GRID), scipy_starts, replace=False)
    logs = [np.log(v) for v in (runs.n_params, runs.n_tokens, runs.loss)]
    per_jax = t_jax / len(EPOCH_GRID)
    all_values = np.asarray(fit.result.all_values)
    jax_subset_best = float(np.min(all_values[subset]))
    law = [float(v) for v in fit.law]
    print(f"loss-law fit: jax {len(EPOCH_GRID)} starts in {t_jax:.1f} s ({per_jax * 1e3:.2f} ms/start; first call "
          f"{first_s:.1f} s with compilation), objective {float(fit.result.value):.10g}\n"
          f"  jax optimum: E={law[0]:.5f} A={law[1]:.2f} B={law[2]:.2f} alpha={law[3]:.5f} beta={law[4]:.5f}; "
          f"best over the SciPy subset of starts {jax_subset_best:.10g}", flush=True)
    rows = []
    for label, analytic in (("finite-difference gradient (SciPy default)", False), ("analytic NumPy gradient", True)):
        times = []
        for _ in range(max(1, min(repeats, 3))):  # a loop takes seconds: three are enough for a median
            start = time.perf_counter()
            params, values = numpy_reference.fit_loss_law_scipy(EPOCH_GRID[subset], *logs, analytic_gradient=analytic)
            times.append(time.perf_counter() - start)
        t_scipy = float(np.median(times))
        per_scipy = t_scipy / scipy_starts
        best = params[np.argmin(values)]
        optimum = min(float(fit.result.value), float(values.min()))
        share_jax, share_jax_subset = reached_share(all_values, optimum), reached_share(all_values[subset], optimum)
        share_scipy = reached_share(values, optimum)
        print(f"  scipy L-BFGS-B, {label}: {scipy_starts} starts in {t_scipy:.1f} s ({per_scipy * 1e3:.1f} ms/start)"
              f"  ratio per start {per_scipy / per_jax:.1f}x; optimum E={np.exp(best[2]):.5f} A={np.exp(best[0]):.2f} "
              f"B={np.exp(best[1]):.2f} alpha={best[3]:.5f} beta={best[4]:.5f} objective {values.min():.10g}\n"
              f"    starts reaching the best objective (within {REACHED:g}): jax {share_jax:.1%} of all, "
              f"{share_jax_subset:.1%} of the subset; scipy {share_scipy:.1%} of the subset", flush=True)
        rows.append(dict(name=f"loss_law_fit vs scipy ({label})", n=len(EPOCH_GRID), jax_s=t_jax,
                         jax_first_call_s=first_s, baseline_s=t_scipy, baseline_starts=scipy_starts,
                         speedup_per_start=per_scipy / per_jax, jax_objective=float(fit.result.value),
                         scipy_subset_objective=float(values.min()), jax_subset_objective=jax_subset_best,
                         jax_reached_share=share_jax, jax_subset_reached_share=share_jax_subset,
                         scipy_reached_share=share_scipy))
    return rows


def bench_calibration(datasets: int) -> list[dict]:
    from sdsl_jax.validation.calibration import loss_law_coverage, n_star_coverage, plane_coverage

    rows = []
    for name, fn in (("plane", plane_coverage), ("loss law", loss_law_coverage)):
        start = time.perf_counter()
        cov = fn(datasets)
        k = datasets * len(cov)
        pooled = float(np.mean(list(cov.values())))
        print(f"calibration {name}: 90% coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
              + f"; pooled {pooled:.3f} over {k} intervals (s.e. {np.sqrt(0.09 / k):.3f}) "
              f"[{time.perf_counter() - start:.0f} s]", flush=True)
        rows.append(dict(name=f"calibration {name}", datasets=datasets, coverage=cov, pooled=pooled))
    start = time.perf_counter()
    cov = n_star_coverage(datasets)
    print("calibration N* with run effects: 90% band coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
          + f" over {datasets} datasets (s.e. {np.sqrt(0.09 / datasets):.3f}) [{time.perf_counter() - start:.0f} s]",
          flush=True)
    rows.append(dict(name="calibration n_star run effects", datasets=datasets, coverage=cov))
    return rows


def bench_nuts_reuse(datasets: int) -> list[dict]:
    """Posteriors of many same-shaped datasets (what calibration and refits do): NumPyro's own
    sampling loop, compiled again on every run, against ``sdsl_jax.infer`` reusing it; same draws.

    One chain, 150 warm-up + 250 draws, on 40-pair plane datasets and on the synthetic ladders
    with per-run effects; the first run of each side (compilation) is reported separately.
    """
    from sdsl_jax.validation.calibration import synthetic_ladder
    from sdsl_jax import SDSL2026, infer

    rng = np.random.default_rng(0)
    x, y = rng.uniform(5, 60, (datasets, 40)), rng.uniform(3, 20, (datasets, 40))
    alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.03, x.shape)
    ladders = [synthetic_ladder(rng) for _ in range(datasets)]
    kw = dict(num_chains=1, num_warmup=150, num_samples=250, progress_bar=False, summarize=False)
    cases = (("plane, 40 pairs", lambda i: infer.sample_plane(x[i], y[i], alpha[i], seed=i, **kw)),
             ("loss law with run effects, 28 runs", lambda i: infer.sample_loss_law(
                 *ladders[i][:3], run=ladders[i][3], seed=i, **kw)))
    rows = []
    for name, sample in cases:
        times, draws = {}, {}
        for side in ("numpyro", "sdsl_jax"):
            infer.clear_sampler_caches()
            with infer.compiled_loop_reuse(side == "sdsl_jax"):
                start = time.perf_counter()
                first = sample(0)
                first_s = time.perf_counter() - start
                start = time.perf_counter()
                runs = [sample(i) for i in range(1, datasets)]
                times[side] = (first_s, (time.perf_counter() - start) / (datasets - 1))
                draws[side] = [first, *runs]
        same = all(np.array_equal(a.samples[k], b.samples[k]) for a, b in zip(draws["numpyro"], draws["sdsl_jax"])
                   for k in a.samples)
        print(f"nuts {name}: per dataset after the first, NumPyro's loop {times['numpyro'][1]:.2f} s, reused "
              f"{times['sdsl_jax'][1]:.2f} s, ratio {times['numpyro'][1] / times['sdsl_jax'][1]:.1f}x "
              f"(first run {times['numpyro'][0]:.1f} / {times['sdsl_jax'][0]:.1f} s); identical draws: {same}",
              flush=True)
        rows.append(dict(name=f"nuts reuse {name}", datasets=datasets, numpyro_s=times["numpyro"][1],
                         jax_s=times["sdsl_jax"][1], speedup=times["numpyro"][1] / times["sdsl_jax"][1],
                         first_run_s=[times["numpyro"][0], times["sdsl_jax"][0]], identical=same))
    return rows


def _prior_at_unit_size(centre):
    """The Chinchilla priors stated at N = D = 1 (``log A, log B ~ Normal(6, 4)``), the usual way of
    writing them and the alternative the shipped priors at the data's centre are measured against."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    a = numpyro.sample("a", dist.Normal(6.0, 4.0))
    b = numpyro.sample("b", dist.Normal(6.0, 4.0))
    e = numpyro.sample("e", dist.Normal(0.5, 1.0))
    alpha = numpyro.sample("alpha", dist.LogNormal(jnp.log(0.35), 0.5))
    beta = numpyro.sample("beta", dist.LogNormal(jnp.log(0.35), 0.5))
    return jnp.stack([a, b, e, alpha, beta])


def _prior_terms_sampled_as_stated(centre):
    """The shipped Chinchilla priors, with NUTS sampling ``e, a_ref, b_ref`` themselves rather than the
    level-and-slopes coordinates of the same prior: the alternative those coordinates are measured against."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from sdsl_jax.loss_laws import _exponent_prior

    alpha = numpyro.sample("alpha", _exponent_prior())
    beta = numpyro.sample("beta", _exponent_prior())
    a_ref = numpyro.sample("a_ref", dist.Normal(-1.0, 2.0))
    b_ref = numpyro.sample("b_ref", dist.Normal(-1.0, 2.0))
    e = numpyro.sample("e", dist.Normal(0.5, 1.0))
    a = numpyro.deterministic("a", a_ref + alpha * centre.log_n)
    b = numpyro.deterministic("b", b_ref + beta * centre.log_d)
    return jnp.stack([a, b, e, alpha, beta])


def _data_prior_sampled_as_stated(centre):
    """The shipped data-only priors, with NUTS sampling ``b_ref, e`` themselves rather than the
    level-and-slope coordinates of the same prior."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from sdsl_jax.loss_laws import _exponent_prior

    beta = numpyro.sample("beta", _exponent_prior())
    b_ref = numpyro.sample("b_ref", dist.Normal(-1.0, 2.0))
    e = numpyro.sample("e", dist.Normal(0.5, 1.0))
    b = numpyro.deterministic("b", b_ref + beta * centre.log_d)
    return jnp.stack([b, e, beta])


GEOMETRY_SEEDS = (0, 1, 2, 3)


def bench_nuts_geometry() -> list[dict]:
    """NUTS on the shipped posteriors (4 chains x (500 + 500), dense mass matrix, no reruns, seeds
    ``GEOMETRY_SEEDS``) in three coordinates of the Chinchilla law: its terms stated at N = D = 1; stated
    at the data's centre and sampled as stated; the same prior sampled as the log loss at the centre and
    the terms' log slopes (shipped). Per run: leapfrog steps per draw, draws at the tree-depth cap,
    bulk ESS, R-hat, divergences and ESS per second; per coordinates, how many runs pass every check.
    The same for the data-only law on the ladder, sampled as stated against the shipped level and slope."""
    import dataclasses

    from sdsl_jax import CHINCHILLA, infer
    from sdsl_jax.data import load_pretraining
    from sdsl_jax.loss_laws import DATA_ONLY

    variants = (("terms at N = 1", dataclasses.replace(CHINCHILLA, prior=_prior_at_unit_size)),
                ("terms at the centre, sampled as stated",
                 dataclasses.replace(CHINCHILLA, prior=_prior_terms_sampled_as_stated)),
                ("level and slopes at the centre (shipped)", CHINCHILLA))
    data_only = (("data-only law, sampled as stated", dataclasses.replace(DATA_ONLY, prior=_data_prior_sampled_as_stated)),
                 ("data-only law, level and slope at the centre (shipped)", DATA_ONLY))
    datasets = (("Chinchilla reference", "fits/data/chinchilla_fig4.csv", False, variants),
                ("model ladder, run effects", "fits/ladder/pretraining.csv", True, variants + data_only))
    rows = []
    for name, path, effects, families in datasets:
        runs = load_pretraining(path)
        run = runs.run_index()[0] if effects else None
        for side, family in families:
            infer.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, run=run, num_chains=4,
                                  num_warmup=20, num_samples=20, progress_bar=False, retries=0)  # compiles
            records = []
            for seed in GEOMETRY_SEEDS:
                start = time.perf_counter()
                out = infer.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, run=run,
                                            num_chains=4, num_warmup=500, num_samples=500, progress_bar=False,
                                            retries=0, seed=seed)
                records.append(_geometry_record(f"{name}, {side}, seed {seed}", out, time.perf_counter() - start))
            passing = sum(r["ok"] for r in records)
            print(f"nuts geometry, {name}, {side}: {passing} of {len(records)} runs pass every check; median steps "
                  f"per draw {np.median([r['median_steps'] for r in records]):.0f}, divergent transitions "
                  f"{sum(r['divergences'] for r in records)}", flush=True)
            rows.append(dict(name=f"nuts geometry {name}, {side}", runs=records, passing=passing))
    rows += _bench_effect_coordinates()
    return rows


def _geometry_record(label: str, out, seconds: float, *, site: str | None = None) -> dict:
    """One NUTS run's geometry (steps per draw, draws at the cap, ESS, R-hat, divergences, time), printed."""
    d = out.diagnostics
    record = dict(seconds=seconds, median_steps=d.median_steps, mean_steps=d.mean_steps, at_cap=d.max_tree_depth_share,
                  min_ess=d.min_ess_bulk, max_rhat=d.max_rhat, divergences=d.num_divergences, ok=d.ok,
                  ess_per_s=d.min_ess_bulk / seconds)
    posterior = ""
    if site is not None:
        record.update({site: float(np.mean(out.samples[site])), f"{site}_sd": float(np.std(out.samples[site]))})
        posterior = f"; {site} {record[site]:.5f} +- {record[site + '_sd']:.5f}"
    print(f"nuts geometry, {label}: median {d.median_steps:.0f} steps per draw (mean {d.mean_steps:.0f}), "
          f"{d.max_tree_depth_share:.0%} at the cap, min bulk ESS {d.min_ess_bulk:.0f}, max R-hat {d.max_rhat:.3f}, "
          f"{d.num_divergences} divergent, {seconds:.1f} s, {d.min_ess_bulk / seconds:.0f} ESS/s{posterior}; "
          f"checks {'pass' if d.ok else 'fail'}", flush=True)
    return record


def _bench_effect_coordinates() -> list[dict]:
    """The acceptance plane with per-model effects on the ladder's pairs, in the non-centred coordinates
    (shipped) and the projected ones (``sample_plane(effects="projected")``), at target acceptance
    0.99: the same posterior, steps per draw, effective draws and time."""
    from sdsl_jax import infer
    from sdsl_jax.data import load_acceptance

    pairs = load_acceptance("fits/ladder-v1/acceptance.csv")
    draft, _, target, _ = pairs.model_index()
    result = {}
    for effects in ("non-centred", "projected"):
        kw = dict(weights=pairs.regression_weights(), draft=draft, target=target, effects=effects, num_chains=4,
                  progress_bar=False, retries=0, target_accept=0.99)
        infer.sample_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha, num_warmup=20, num_samples=20, **kw)
        start = time.perf_counter()
        out = infer.sample_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha, num_warmup=500, num_samples=500, **kw)
        result[effects] = _geometry_record(f"ladder pairs with model effects, {effects}", out,
                                           time.perf_counter() - start, site="A")
    old, new = result["non-centred"], result["projected"]
    print(f"nuts geometry, ladder pairs with model effects: steps per draw {old['median_steps'] / new['median_steps']:.1f}x "
          f"fewer, time {old['seconds'] / new['seconds']:.2f}x", flush=True)
    return [dict(name="nuts geometry ladder pairs with model effects", non_centred=old, projected=new,
                 steps_ratio=old["median_steps"] / new["median_steps"], time_ratio=old["seconds"] / new["seconds"])]


def _plane_runs(pairs, seeds: int, **kw) -> dict:
    """``seeds`` NUTS runs of ``sample_plane(pairs, **kw)`` (4 x (500 + 500) after one short run that
    compiles): each run's checks, steps per draw and time, and their summary over the seeds."""
    from sdsl_jax import infer

    infer.sample_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha, num_warmup=20, num_samples=20, **kw)
    runs = []
    for seed in range(seeds):
        start = time.perf_counter()
        d = infer.sample_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha, num_warmup=500, num_samples=500,
                               seed=seed, **kw).diagnostics
        runs.append(dict(seconds=time.perf_counter() - start, ok=d.ok, divergences=d.num_divergences,
                         min_ess=d.min_ess_bulk, max_rhat=d.max_rhat, median_steps=d.median_steps,
                         at_cap=d.max_tree_depth_share))
    return dict(runs=runs, passed=sum(r["ok"] for r in runs), with_divergences=sum(r["divergences"] > 0 for r in runs),
                divergences=sum(r["divergences"] for r in runs),
                median_steps=float(np.median([r["median_steps"] for r in runs])),
                median_min_ess=float(np.median([r["min_ess"] for r in runs])),
                worst_rhat=float(max(r["max_rhat"] for r in runs)),
                median_seconds=float(np.median([r["seconds"] for r in runs])))


def bench_effect_sides(seeds: int = 6) -> list[dict]:
    """The acceptance plane's checks with per-model effects on the kinds of model the design identifies
    (the ladder: the drafts only, :meth:`AcceptanceMeasurements.model_effects_identified`) against
    effects on both kinds, non-centred and projected, over ``seeds`` NUTS runs each (4 x (500 + 500),
    target acceptance 0.99, no reruns), on all the ladder's pairs and on the pairs without its
    smallest size (a closure's refit): how many runs pass R-hat, bulk ESS and no divergences."""
    from sdsl_jax.data import load_acceptance

    pairs = load_acceptance("fits/ladder-v1/acceptance.csv")
    smallest = float(np.min(pairs.n_draft))
    data = {"all pairs": pairs,
            "without the smallest size": pairs.select((pairs.n_draft != smallest) & (pairs.n_target != smallest))}
    variants = {"drafts only (shipped)": dict(effect_sides=("draft",)),
                "both kinds, non-centred": dict(effects="non-centred"),
                "both kinds, projected": dict(effects="projected")}
    rows = []
    for data_name, kept in data.items():
        draft, _, target, _ = kept.model_index()
        result = {}
        for variant, extra in variants.items():
            kw = dict(weights=kept.regression_weights(), draft=draft, target=target, num_chains=4, progress_bar=False,
                      retries=0, target_accept=0.99, **extra)
            summary = _plane_runs(kept, seeds, **kw)
            result[variant] = summary
            print(f"effect sides, {data_name}, {variant}: {summary['passed']}/{seeds} runs pass their checks, "
                  f"{summary['with_divergences']} with divergences ({summary['divergences']} in all), median min "
                  f"bulk ESS {summary['median_min_ess']:.0f}, worst R-hat {summary['worst_rhat']:.3f}, median "
                  f"{summary['median_seconds']:.1f} s", flush=True)
        shipped, both = result["drafts only (shipped)"], result["both kinds, non-centred"]
        print(f"effect sides, {data_name}: drafts only passes {shipped['passed']}/{seeds} against {both['passed']}/"
              f"{seeds}, time {both['median_seconds'] / shipped['median_seconds']:.2f}x faster", flush=True)
        rows.append(dict(name=f"effect sides {data_name}", seeds=seeds, **result))
    return rows


def bench_effects_target_accept(seeds: int = 4, models: Sequence[str] | None = None) -> list[dict]:
    """Each acceptance model with per-draft and per-target effects on the factorial ladder's pairs
    (``fits/ladder/acceptance.csv``: both kinds identified) at target acceptance 0.9 and 0.99 (the
    shipped one is ``AcceptanceModel.effects_target_accept``), ``seeds`` NUTS runs each (4 x (500 +
    500), no reruns): runs passing every check, divergent transitions, leapfrog steps per draw,
    bulk ESS and time. ``models``: the acceptance models' names (default: all)."""
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.data import load_acceptance

    pairs = load_acceptance("fits/ladder/acceptance.csv")
    draft, _, target, _ = pairs.model_index()
    rows = []
    for name in models or ACCEPTANCE_MODELS:
        model, result = ACCEPTANCE_MODELS[name], {}
        for accept in (0.9, 0.99):
            kw = dict(weights=pairs.regression_weights(), model=model, draft=draft, target=target, num_chains=4,
                      progress_bar=False, retries=0, target_accept=accept)
            summary = _plane_runs(pairs, seeds, **kw)
            result[f"target_accept_{accept}"] = summary
            print(f"effects target acceptance, {name} at {accept}{' (shipped)' if accept == model.effects_target_accept else ''}: "
                  f"{summary['passed']}/{seeds} runs pass, {summary['divergences']} divergent transitions, median "
                  f"{summary['median_steps']:.0f} steps per draw, median min bulk ESS {summary['median_min_ess']:.0f}, "
                  f"worst R-hat {summary['worst_rhat']:.3f}, median {summary['median_seconds']:.1f} s", flush=True)
        low, high = result["target_accept_0.9"], result["target_accept_0.99"]
        print(f"effects target acceptance, {name}: at 0.9 {high['median_steps'] / low['median_steps']:.1f}x fewer "
              f"steps per draw than at 0.99, time {high['median_seconds'] / low['median_seconds']:.2f}x", flush=True)
        rows.append(dict(name=f"effects target acceptance {name}", seeds=seeds, **result))
    return rows


def _break_in_stated_coordinates(centre, *, anywhere: bool = False):
    """The one-break law's prior sampled as it is stated: ``c ~ Normal(0, 1)`` and the D term's size
    before its break in ``level_and_slopes``, the alternative the shipped coordinates are measured
    against (the same prior). ``anywhere``: the break anywhere, ``log D_break ~ Normal(18, 6)`` (1e3
    to 1e13 tokens at 95%) whatever the data's span, the alternative the shipped prior (the break
    inside the data's span of D) is measured against."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from sdsl_jax.loss_laws import _power_terms_prior

    a, b, e, alpha, beta = _power_terms_prior(centre)
    if anywhere:
        log_db = numpyro.sample("log_d_break", dist.Normal(18.0, 6.0))
    else:
        position = numpyro.sample("break_logit", dist.Normal(0.0, 1.5))
        span = centre.log_d_high - centre.log_d_low
        log_db = numpyro.deterministic("log_d_break", centre.log_d_low + span * jax.nn.sigmoid(position))
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    log_f = numpyro.sample("log_f", dist.Normal(0.0, 1.0))
    return jnp.stack([a, b, e, alpha, beta, log_db, c, log_f])


_break_anywhere = functools.partial(_break_in_stated_coordinates, anywhere=True)


def bench_break_prior(seeds: int = 2) -> list[dict]:
    """The one-break law's posterior on the factorial ladder (run effects, 4 x (500 + 500), target
    acceptance 0.99, no reruns) with its break inside the data's span of D (shipped) against a break
    anywhere: steps per draw, draws at the tree-depth cap, ESS, R-hat, and the share of draws whose
    data term rises with D after the break (``beta + c < 0``), for ``seeds`` seeds each."""
    import dataclasses

    from sdsl_jax import infer
    from sdsl_jax.data import load_pretraining
    from sdsl_jax.loss_laws import BROKEN_POWER_LAW

    runs = load_pretraining("fits/ladder/pretraining.csv")
    run = runs.run_index()[0]
    variants = (("break anywhere", dataclasses.replace(BROKEN_POWER_LAW, prior=_break_anywhere)),
                ("break inside the data's span", BROKEN_POWER_LAW))
    result = {}
    for side, family in variants:
        infer.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, run=run, num_chains=4,
                              num_warmup=20, num_samples=20, progress_bar=False, retries=0)  # compiles
        records = []
        for seed in range(seeds):
            start = time.perf_counter()
            out = infer.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, run=run, seed=seed,
                                        num_chains=4, num_warmup=500, num_samples=500, progress_bar=False, retries=0)
            rising = float(np.mean(out.samples["beta"] + out.samples["c"] < 0))
            records.append(dict(_geometry_record(f"one-break law, {side}, seed {seed}", out,
                                                 time.perf_counter() - start), seed=seed, rising_after_break=rising))
            print(f"  draws whose data term rises with D after the break: {rising:.1%}", flush=True)
        result[side] = records
    old, new = (result[side] for side, _ in variants)
    ratio = float(np.median([o["median_steps"] for o in old]) / np.median([n["median_steps"] for n in new]))
    print(f"one-break law: {ratio:.1f}x fewer steps per draw (median over seeds) with the break inside the data",
          flush=True)
    return [dict(name="one-break law break prior", seeds=seeds, break_anywhere=old, break_inside_span=new,
                 steps_ratio=ratio)]


def bench_break_acceptance(seeds: int = 3, reruns: int = 0) -> list[dict]:
    """The one-break law's posterior on the ladder (run effects, 4 x (500 + 500), ``reruns`` reruns of
    a run that fails its checks) at NUTS's default target acceptance 0.9, at 0.95 and at the family's
    0.99, on all runs and without the 74k size (a closure's refit): how many of ``seeds`` runs pass
    their checks, their divergences, worst R-hat and bulk ESS, leapfrog steps per draw and attempts."""
    from sdsl_jax import infer
    from sdsl_jax.data import load_pretraining
    from sdsl_jax.loss_laws import BROKEN_POWER_LAW

    runs = load_pretraining("fits/ladder-v1/pretraining.csv")
    sizes = np.unique(runs.n_params)
    data = {"all runs": runs, f"without the {sizes[2]:.3g}-parameter size": runs.select(runs.n_params != sizes[2])}
    rows = []
    for data_name, kept in data.items():
        run, _ = kept.run_index()
        result = {}
        for accept in (0.9, 0.95, BROKEN_POWER_LAW.target_accept):
            outs = []
            for seed in range(seeds):
                start = time.perf_counter()
                d = infer.sample_loss_law(kept.n_params, kept.n_tokens, kept.loss, family=BROKEN_POWER_LAW, run=run,
                                          num_chains=4, num_warmup=500, num_samples=500, seed=seed, progress_bar=False,
                                          target_accept=accept, retries=reruns).diagnostics
                outs.append(dict(seconds=time.perf_counter() - start, ok=d.ok, divergences=d.num_divergences,
                                 min_ess=d.min_ess_bulk, max_rhat=d.max_rhat, median_steps=d.median_steps,
                                 attempts=d.attempts))
            summary = dict(runs=outs, passed=sum(o["ok"] for o in outs), divergences=sum(o["divergences"] for o in outs),
                           with_divergences=sum(o["divergences"] > 0 for o in outs),
                           worst_rhat=float(max(o["max_rhat"] for o in outs)),
                           worst_ess=float(min(o["min_ess"] for o in outs)),
                           median_steps=[o["median_steps"] for o in outs],
                           median_seconds=float(np.median([o["seconds"] for o in outs])))
            result[f"target_accept_{accept}"] = summary
            print(f"one-break law, {data_name}, target acceptance {accept}, {reruns} reruns: {summary['passed']}/{seeds} "
                  f"runs pass their checks, {summary['with_divergences']} with divergences ({summary['divergences']} in "
                  f"all), worst R-hat {summary['worst_rhat']:.3f}, worst bulk ESS {summary['worst_ess']:.0f}, "
                  f"median leapfrog steps per draw "
                  f"{', '.join(f'{m:.0f}' for m in summary['median_steps'])}, median {summary['median_seconds']:.1f} s",
                  flush=True)
        rows.append(dict(name=f"one-break law target acceptance {data_name}", seeds=seeds, reruns=reruns, **result))
    return rows


def bench_break_coordinates(seeds: int = 5, reruns: int = 2) -> list[dict]:
    """The one-break law's posterior on the first ladder (all 28 runs, run effects, 4 x (500 + 500),
    ``reruns`` reruns of a run that fails its checks) in its shipped coordinates (the slope after the
    break, the D term at the data's centre with the break) against the coordinates its prior is
    stated in, at target acceptance 0.95 and the family's own: runs passing on the first attempt and
    after the reruns, attempts, leapfrog steps per draw and bulk ESS of the last run, seconds."""
    import dataclasses

    from sdsl_jax import infer
    from sdsl_jax.data import load_pretraining
    from sdsl_jax.loss_laws import BROKEN_POWER_LAW

    runs = load_pretraining("fits/ladder-v1/pretraining.csv")
    run, _ = runs.run_index()
    variants = (("as stated (c, the D term before the break)",
                 dataclasses.replace(BROKEN_POWER_LAW, prior=_break_in_stated_coordinates)),
                ("shipped (slope after the break, the D term at the centre)", BROKEN_POWER_LAW))
    rows = []
    for accept in (0.95, BROKEN_POWER_LAW.target_accept):
        for side, family in variants:
            infer.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, run=run,
                                  num_chains=4, num_warmup=20, num_samples=20, progress_bar=False,
                                  retries=0)  # compiles
            outs = []
            for seed in range(seeds):
                start = time.perf_counter()
                d = infer.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, run=run,
                                          num_chains=4, num_warmup=500, num_samples=500, seed=seed,
                                          progress_bar=False, target_accept=accept,
                                          retries=reruns).diagnostics
                outs.append(dict(seconds=time.perf_counter() - start, ok=d.ok, attempts=d.attempts,
                                 median_steps=d.median_steps, min_ess=d.min_ess_bulk, max_rhat=d.max_rhat,
                                 divergences=d.num_divergences))
            first = sum(o["ok"] and o["attempts"] == 1 for o in outs)
            attempts = ", ".join(str(o["attempts"]) for o in outs)
            print(f"one-break law, {side}, target acceptance {accept}: "
                  f"{first}/{seeds} pass on the first run, "
                  f"{sum(o['ok'] for o in outs)}/{seeds} after up to {reruns} reruns (attempts {attempts}); "
                  f"last run's median leapfrog steps per draw "
                  f"{', '.join(format(o['median_steps'], '.0f') for o in outs)}, bulk ESS "
                  f"{', '.join(format(o['min_ess'], '.0f') for o in outs)}; seconds "
                  f"{', '.join(format(o['seconds'], '.1f') for o in outs)}", flush=True)
            rows.append(dict(name=f"one-break law coordinates {side} at {accept}", seeds=seeds, reruns=reruns,
                             target_accept=accept, passed_first=first, runs=outs))
    return rows


def bench_rerun_policy(seeds: int = 3) -> list[dict]:
    """A posterior that fails its checks, run again: the shipped reruns (twice the warm-up and draws
    and the target acceptance raised on every rerun, :func:`sdsl_jax.infer.posterior.rerun_until_checked`)
    against raising it only after a run with divergent transitions (the rest the same). Kaplan's law on
    the first ladder as the closure refits it (the runs up to the third size, without the third size,
    all runs with every prior twice as wide), 4 x (500 + 500), two reruns, ``seeds`` runs each: runs
    passing, leapfrog steps per draw of the last run, attempts and time."""
    from sdsl_jax import infer
    from sdsl_jax.data import load_pretraining
    from sdsl_jax.infer.posterior import rerun_settings
    from sdsl_jax.loss_laws import KAPLAN

    runs = load_pretraining("fits/ladder-v1/pretraining.csv")
    third = np.unique(runs.n_params)[2]
    data = {f"up to the {third:.3g}-parameter size": (runs.select(runs.n_params <= third), 1.0),
            f"without the {third:.3g}-parameter size": (runs.select(runs.n_params != third), 1.0),
            "all runs, priors twice as wide": (runs, 2.0)}
    reruns = 2

    def sample(kept, width, **kw):
        return infer.sample_loss_law(kept.n_params, kept.n_tokens, kept.loss, family=KAPLAN, run=kept.run_index()[0],
                                     num_chains=4, progress_bar=False, prior_width=width, **kw).diagnostics

    def raised_after_divergences(kept, width, seed):
        d = sample(kept, width, num_warmup=500, num_samples=500, seed=seed, target_accept=KAPLAN.target_accept)
        accept = KAPLAN.target_accept
        for k in range(1, reruns + 1):
            if d.ok:
                break
            warmup, draws, _, seed_k = rerun_settings(k, num_warmup=500, num_samples=500, target_accept=0.0, seed=seed)
            if d.num_divergences:  # the shipped first rerun's raise, from this run's target acceptance
                accept = rerun_settings(1, num_warmup=500, num_samples=500, target_accept=accept, seed=seed)[2]
            d = sample(kept, width, num_warmup=warmup, num_samples=draws, seed=seed_k,
                       target_accept=accept)._replace(attempts=k + 1)
        return d

    policies = {"shipped (raised on every rerun)": lambda kept, width, seed: sample(
                    kept, width, num_warmup=500, num_samples=500, seed=seed, retries=reruns),
                "raised only after divergences": raised_after_divergences}
    rows = []
    for data_name, (kept, width) in data.items():
        result = {}
        for policy, run_one in policies.items():
            outs = []
            for seed in range(seeds):
                start = time.perf_counter()
                d = run_one(kept, width, seed)
                outs.append(dict(seconds=time.perf_counter() - start, ok=d.ok, median_steps=d.median_steps,
                                 attempts=d.attempts, divergences=d.num_divergences))
            result[policy] = dict(runs=outs, passed=sum(o["ok"] for o in outs),
                                  median_seconds=float(np.median([o["seconds"] for o in outs])))
            steps = ", ".join(f"{o['median_steps']:.0f}" for o in outs)
            attempts = ", ".join(str(o["attempts"]) for o in outs)
            print(f"Kaplan's law, {data_name}, reruns {policy}: {result[policy]['passed']}/{seeds} pass their checks, "
                  f"median leapfrog steps per draw {steps}, attempts {attempts}, median "
                  f"{result[policy]['median_seconds']:.1f} s", flush=True)
        rows.append(dict(name=f"rerun policy, Kaplan's law, {data_name}", seeds=seeds, reruns=reruns, **result))
    return rows


def bench_acceptance_warmup(seeds: int = 2, models: Sequence[str] | None = None, *,
                            prior_starts: bool = False) -> list[dict]:
    """Where an acceptance posterior's leapfrog steps go: each acceptance model with per-draft and
    per-target effects on the factorial ladder's pairs, 4 chains x (500 + 500) at the model's shipped
    target acceptance, ``seeds`` runs, in the shipped coordinates (coefficients scaled to their prior,
    chains from prior draws) and with the coefficients scaled to the data (least squares, chains
    ``sample_plane(..., coefficients="data-scaled")``, :func:`sdsl_jax.infer.models.coefficient_frame`),
    chains started as ``sample_plane`` starts them (from the prior; dispersed about the least-squares
    point, :func:`sdsl_jax.infer.models.dispersed_about_frame`), and, with ``prior_starts``, the
    data-scaled coordinates from prior draws too: leapfrog steps in the warm-up (its first 100 iterations apart)
    and in the draws, bulk ESS, R-hat, divergences and time."""
    import arviz as az
    import jax.numpy as jnp
    from numpyro.infer import MCMC, NUTS

    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.data import load_acceptance
    from sdsl_jax.infer.models import coefficient_frame, dispersed_about_frame
    from sdsl_jax.infer.sampler import prior_starts as draw_starts
    from sdsl_jax.infer.posterior import acceptance_numpyro_model

    pairs = load_acceptance("fits/ladder/acceptance.csv")
    draft, _, target, _ = pairs.model_index()
    weights = pairs.regression_weights()
    alpha = jnp.asarray(pairs.alpha, jnp.float64)
    sites = ("A", "B", "C", "sigma", "draft_sd", "target_sd")
    rows = []
    for name in models or ACCEPTANCE_MODELS:
        m = ACCEPTANCE_MODELS[name]
        frame = coefficient_frame(m, pairs.ppl_draft, pairs.ppl_target, pairs.alpha, weights=weights,
                                  pairs_per_model=len(pairs.alpha) / (int(np.max(draft)) + 1))
        shipped, scaled = (acceptance_numpyro_model(m, pairs.ppl_draft, pairs.ppl_target, weights=weights,
                                                    draft=draft, target=target, frame=f) for f in (None, frame))
        variants = {"prior-scaled (shipped)": (*shipped, shipped[0]),
                    "data-scaled": (*scaled, dispersed_about_frame(scaled[0]))}
        if prior_starts:
            variants["data-scaled, chains from the prior"] = (*scaled, scaled[0])
        result = {}
        for variant, (model, model_args, start_model) in variants.items():
            runs = []
            for seed in range(seeds):
                kernel = NUTS(model, dense_mass=True, target_accept_prob=m.effects_target_accept)
                draws, warm_first, warm_rest, drawn, divergent, start = [], 0, 0, 0, 0, time.perf_counter()
                starts = draw_starts(start_model, (*model_args, alpha), 4, seed)  # alpha observed, as fits start
                for chain in range(4):
                    mcmc = MCMC(kernel, num_warmup=500, num_samples=500, num_chains=1, progress_bar=False)
                    key = jax.random.PRNGKey(1000 * seed + chain)
                    mcmc.warmup(key, *model_args, alpha=alpha, collect_warmup=True, extra_fields=("num_steps",),
                                init_params={k: v[chain] for k, v in starts.items()})
                    steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
                    warm_first, warm_rest = warm_first + int(steps[:100].sum()), warm_rest + int(steps[100:].sum())
                    mcmc.run(jax.random.fold_in(key, 1), *model_args, alpha=alpha,
                             extra_fields=("num_steps", "diverging"))
                    extra = mcmc.get_extra_fields()
                    drawn += int(np.sum(extra["num_steps"]))
                    divergent += int(np.sum(extra["diverging"]))
                    draws.append({k: np.asarray(s) for k, s in mcmc.get_samples().items() if k in sites})
                seconds = time.perf_counter() - start
                posterior = az.from_dict(posterior={k: np.stack([d[k] for d in draws]) for k in sites})
                ess = az.ess(posterior, method="bulk")
                rhat = az.rhat(posterior)
                runs.append(dict(seconds=seconds, warmup_steps_first_100=warm_first, warmup_steps_rest=warm_rest,
                                 draw_steps=drawn, divergences=divergent,
                                 min_ess=float(min(ess[k].values for k in sites)),
                                 max_rhat=float(max(rhat[k].values for k in sites)),
                                 posterior_sd={k: float(np.std(np.concatenate([d[k] for d in draws]))) for k in sites}))
                r = runs[-1]
                print(f"acceptance warm-up, {name}, {variant}, seed {seed}: leapfrog steps (4 chains) warm-up "
                      f"{r['warmup_steps_first_100']:,} in the first 100 iterations + {r['warmup_steps_rest']:,}, "
                      f"draws {r['draw_steps']:,}; min bulk ESS {r['min_ess']:.0f}, max R-hat {r['max_rhat']:.3f}, "
                      f"{r['divergences']} divergent, {seconds:.1f} s", flush=True)
            result[variant] = runs
        total = {k: np.median([r["warmup_steps_first_100"] + r["warmup_steps_rest"] + r["draw_steps"] for r in runs])
                 for k, runs in result.items()}
        print(f"acceptance warm-up, {name}: data-scaled coefficients take "
              f"{total['prior-scaled (shipped)'] / total['data-scaled']:.2f}x fewer leapfrog steps (medians)", flush=True)
        rows.append(dict(name=f"acceptance warm-up {name}", seeds=seeds, frame_origin=frame.origin.tolist(),
                         frame_unit=frame.unit.tolist(), **result))
    return rows
