"""Bayesian fits with NumPyro, diagnostics, and propagation of posteriors to bands on N*.

Models (one ``numpyro.sample`` per random quantity, named as in the papers):

* :func:`loss_law_model` -- ``log L_i ~ Normal(LSE(a - alpha log N_i, b - beta log D_i, e), sigma)``,
  the likelihood behind Besiroglu et al.'s (2024) fit of Hoffmann et al.'s Approach 3.
* :func:`plane_model` -- ``alpha_i ~ Normal(A x_i + B y_i + C, sigma / sqrt(w_i))``, SDSL's plane
  with per-row weights (iterations measured).

Sampling: NUTS with several chains (vectorised on one device, one per device when there are
enough), started from the point fit with per-chain jitter so that R-hat can see disagreement.
Every run is checked (:func:`check_diagnostics`): split R-hat, bulk ESS and divergences.

Propagation: every posterior draw gives a loss law (and a plane); :func:`propagate_draft_size`
solves N*(M) for each with the vectorised, differentiable solver, in chunks of draws so memory
stays bounded, and summarises N*, M/N*, gamma*, T* and the linear law (mu, M0) by quantiles.
Where the plane has no data it stays at the paper's values and :func:`plane_sensitivity` reports
the implicit derivatives of N* with respect to A, B, C instead of inventing an uncertainty.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.infer import MCMC, NUTS

from sdsl_jax.acceptance import AcceptancePlane
from sdsl_jax.fitting import law_from_theta, loss_law_log_prediction, theta_from_law
from sdsl_jax.optimum import LinearLaw, fit_linear_law, solve_draft_size
from sdsl_jax.scaling import LossLaw

with warnings.catch_warnings():  # ArviZ announces its refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

__all__ = [
    "loss_law_model",
    "plane_model",
    "PosteriorRun",
    "Diagnostics",
    "sample_loss_law",
    "sample_plane",
    "check_diagnostics",
    "laws_from_posterior",
    "planes_from_posterior",
    "DraftSizeBands",
    "propagate_draft_size",
    "plane_sensitivity",
    "interval_coverage",
]

LOSS_LAW_SITES = ("a", "b", "e", "alpha", "beta", "sigma", "nu")
PLANE_SITES = ("A", "B", "C", "sigma")


def loss_law_model(log_n: jax.Array, log_d: jax.Array, log_loss: jax.Array | None = None) -> None:
    """Chinchilla loss law with a robust (Student-t) likelihood on log loss.

    Student-t rather than Gaussian for the reason the Epoch replication uses a Huber loss: runs
    read off a figure include outliers, and a Gaussian lets a handful of them move E by 3% and B
    by a factor of two (checked on the shipped data).

    Priors (weakly informative; each spans every published fit by a wide margin):

    * ``a, b ~ Normal(6, 4)``: log A, log B. Published fits have A, B between 4e2 and 2e3
      (log 6-7.7); the prior's 95% range is A in [5e-1, 8e5].
    * ``e ~ Normal(0.5, 1)``: log E, E in [0.2, 12] nats at 95%; text entropy is O(1) nat.
    * ``alpha, beta ~ LogNormal(log 0.35, 0.5)``: positive exponents, 95% in [0.13, 0.93];
      published values are 0.28-0.37.
    * ``sigma ~ HalfNormal(0.1)``: residual scale of log loss; Chinchilla's residuals are ~0.02.
    * ``nu ~ Gamma(2, 0.1)``: degrees of freedom, the prior of Juarez & Steel (2010); mean 20,
      so heavy tails must be supported by the data.
    """
    a = numpyro.sample("a", dist.Normal(6.0, 4.0))
    b = numpyro.sample("b", dist.Normal(6.0, 4.0))
    e = numpyro.sample("e", dist.Normal(0.5, 1.0))
    alpha = numpyro.sample("alpha", dist.LogNormal(jnp.log(0.35), 0.5))
    beta = numpyro.sample("beta", dist.LogNormal(jnp.log(0.35), 0.5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(0.1))
    nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
    mean = loss_law_log_prediction(jnp.stack([a, b, e, alpha, beta]), log_n, log_d)
    with numpyro.plate("runs", log_n.shape[0]):
        numpyro.sample("log_loss", dist.StudentT(nu, mean, sigma), obs=log_loss)


def plane_model(
    ppl_draft: jax.Array, ppl_target: jax.Array, weights: jax.Array, alpha: jax.Array | None = None
) -> None:
    """Acceptance plane ``alpha = A x + B y + C`` with weighted Gaussian noise.

    The predictors are standardised inside the model (NUTS mixes far better) and A, B, C are
    recorded as deterministic sites on the original scale. Priors on the standardised
    coefficients ``Normal(0, 0.5)`` (a one-standard-deviation change of a perplexity moves alpha
    by less than 0.5 at 68%: alpha lives in (0, 1)); the intercept at the mean perplexities
    ``Normal(0.5, 0.5)``; ``sigma ~ HalfNormal(0.2)`` for a row of average weight.
    """
    x_mean, x_std = ppl_draft.mean(), ppl_draft.std() + 1e-12
    y_mean, y_std = ppl_target.mean(), ppl_target.std() + 1e-12
    slope_x = numpyro.sample("slope_x", dist.Normal(0.0, 0.5))
    slope_y = numpyro.sample("slope_y", dist.Normal(0.0, 0.5))
    centre = numpyro.sample("centre", dist.Normal(0.5, 0.5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(0.2))
    A = numpyro.deterministic("A", slope_x / x_std)
    B = numpyro.deterministic("B", slope_y / y_std)
    numpyro.deterministic("C", centre - A * x_mean - B * y_mean)
    mean = centre + slope_x * (ppl_draft - x_mean) / x_std + slope_y * (ppl_target - y_mean) / y_std
    scale = sigma / jnp.sqrt(weights / weights.mean())
    with numpyro.plate("pairs", ppl_draft.shape[0]):
        numpyro.sample("alpha_obs", dist.Normal(mean, scale), obs=alpha)


class Diagnostics(NamedTuple):
    """Convergence checks of a posterior run; ``ok`` is False when any check fails."""

    max_rhat: float
    min_ess_bulk: float
    num_divergences: int
    ok: bool
    problems: tuple[str, ...]


class PosteriorRun(NamedTuple):
    """A finished NUTS run: draws per site (chains flattened), ArviZ data, diagnostics."""

    samples: dict[str, np.ndarray]
    inference_data: az.InferenceData | None
    diagnostics: Diagnostics | None


def check_diagnostics(
    idata: az.InferenceData, divergences: int, *, var_names, max_rhat: float = 1.01, min_ess: float = 400.0
) -> Diagnostics:
    """Split R-hat (rank-normalised), bulk ESS and divergences against the usual thresholds.

    Thresholds follow Vehtari et al. (2021), "Rank-normalization, folding, and localization":
    R-hat < 1.01 and bulk ESS > 400 over all chains; any divergence is reported.
    """
    rhat = az.rhat(idata, var_names=list(var_names))
    ess = az.ess(idata, var_names=list(var_names), method="bulk")
    worst_rhat = max(float(np.max(rhat[v].values)) for v in var_names)
    worst_ess = min(float(np.min(ess[v].values)) for v in var_names)
    problems = []
    if not worst_rhat < max_rhat:
        problems.append(f"R-hat {worst_rhat:.3f} >= {max_rhat} (chains disagree)")
    if not worst_ess > min_ess:
        problems.append(f"bulk ESS {worst_ess:.0f} <= {min_ess:.0f} (too few effective draws)")
    if divergences:
        problems.append(f"{divergences} divergent transitions")
    return Diagnostics(worst_rhat, worst_ess, int(divergences), not problems, tuple(problems))


def _chain_method(num_chains: int) -> str:
    return "parallel" if jax.local_device_count() >= num_chains > 1 else "vectorized"


@functools.lru_cache(maxsize=16)
def _mcmc(model, num_chains, num_warmup, num_samples, progress_bar, target_accept) -> MCMC:
    # Reused across calls with data of the same shapes (jit_model_args): repeated fits, such as
    # calibration over many synthetic datasets, compile once.
    return MCMC(
        NUTS(model, target_accept_prob=target_accept), num_warmup=num_warmup, num_samples=num_samples,
        num_chains=num_chains, chain_method=_chain_method(num_chains), progress_bar=progress_bar,
        jit_model_args=True,
    )


def _run_nuts(model, model_args, *, init_params, var_names, num_chains, num_warmup, num_samples, seed,
              progress_bar, target_accept, summarize) -> PosteriorRun:
    mcmc = _mcmc(model, num_chains, num_warmup, num_samples, progress_bar, target_accept)
    # numpyro's own x64 and dtype handling sit under "standard" promotion.
    with jax.numpy_dtype_promotion("standard"):
        mcmc.run(jax.random.PRNGKey(seed), *model_args, init_params=init_params, extra_fields=("diverging",))
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
    if not summarize:
        return PosteriorRun(samples, None, None)
    divergences = int(np.sum(np.asarray(mcmc.get_extra_fields()["diverging"])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = az.from_numpyro(mcmc, log_likelihood=False)  # pointwise terms: MBs we never use
    return PosteriorRun(samples, idata, check_diagnostics(idata, divergences, var_names=var_names))


def _jittered(centre: dict[str, float], num_chains: int, seed: int, scale: float) -> dict[str, jax.Array]:
    """Per-chain starting points in unconstrained space, spread around ``centre``."""
    key = jax.random.PRNGKey(seed + 7919)
    out = {}
    for i, (name, value) in enumerate(centre.items()):
        noise = scale * jax.random.normal(jax.random.fold_in(key, i), (num_chains,))
        out[name] = jnp.full((num_chains,), value) + noise if num_chains > 1 else jnp.asarray(value + noise[0])
    return out


def sample_loss_law(
    n_params: ArrayLike,
    n_tokens: ArrayLike,
    loss: ArrayLike,
    *,
    init: LossLaw,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
    progress_bar: bool = True,
    target_accept: float = 0.9,
    summarize: bool = True,
) -> PosteriorRun:
    """NUTS posterior of the loss law on runs (N, D, L), started around the point fit ``init``.

    ``summarize=False`` skips the ArviZ conversion and diagnostics (``inference_data`` and
    ``diagnostics`` are then None): for loops over many small fits such as calibration.
    """
    log_n, log_d, log_loss = (jnp.log(jnp.asarray(v, jnp.float64)) for v in (n_params, n_tokens, loss))
    residual = np.asarray(log_loss) - np.asarray(loss_law_log_prediction(theta_from_law(init), log_n, log_d))
    # Unconstrained coordinates: log for the LogNormal/HalfNormal sites.
    centre = dict(a=float(np.log(init.A)), b=float(np.log(init.B)), e=float(np.log(init.E)),
                  alpha=float(np.log(init.alpha)), beta=float(np.log(init.beta)),
                  sigma=float(np.log(max(np.median(np.abs(residual)) * 1.4826, 1e-4))), nu=float(np.log(5.0)))
    return _run_nuts(loss_law_model, (log_n, log_d, log_loss), init_params=_jittered(centre, num_chains, seed, 0.02),
                     var_names=LOSS_LAW_SITES, num_chains=num_chains, num_warmup=num_warmup,
                     num_samples=num_samples, seed=seed, progress_bar=progress_bar, target_accept=target_accept,
                     summarize=summarize)


def sample_plane(
    ppl_draft: ArrayLike,
    ppl_target: ArrayLike,
    alpha: ArrayLike,
    *,
    weights: ArrayLike | None = None,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
    progress_bar: bool = True,
    target_accept: float = 0.9,
    summarize: bool = True,
) -> PosteriorRun:
    """NUTS posterior of the acceptance plane (see :func:`plane_model`); ``summarize`` as in
    :func:`sample_loss_law`."""
    x, y, a = (jnp.asarray(v, jnp.float64) for v in (ppl_draft, ppl_target, alpha))
    w = jnp.ones_like(a) if weights is None else jnp.asarray(weights, jnp.float64)
    # Start at the weighted least-squares plane (standardised coordinates), sigma at its residual.
    xs, ys = (np.asarray(x) - np.mean(x)) / (np.std(x) + 1e-12), (np.asarray(y) - np.mean(y)) / (np.std(y) + 1e-12)
    design = np.stack([xs, ys, np.ones_like(xs)], 1) * np.sqrt(np.asarray(w))[:, None]
    coef, *_ = np.linalg.lstsq(design, np.asarray(a) * np.sqrt(np.asarray(w)), rcond=None)
    resid = np.asarray(a) - np.stack([xs, ys, np.ones_like(xs)], 1) @ coef
    sigma0 = np.sqrt(np.sum(np.asarray(w) * resid**2) / np.sum(np.asarray(w)))
    centre = dict(slope_x=float(coef[0]), slope_y=float(coef[1]), centre=float(coef[2]),
                  sigma=float(np.log(max(sigma0, 1e-4))))
    return _run_nuts(plane_model, (x, y, w, a), init_params=_jittered(centre, num_chains, seed, 0.05),
                     var_names=PLANE_SITES, num_chains=num_chains, num_warmup=num_warmup,
                     num_samples=num_samples, seed=seed, progress_bar=progress_bar, target_accept=target_accept,
                     summarize=summarize)


def laws_from_posterior(samples: dict[str, np.ndarray]) -> LossLaw:
    """Posterior draws of (a, b, e, alpha, beta) as a :class:`LossLaw` of arrays."""
    theta = np.stack([samples[k] for k in ("a", "b", "e", "alpha", "beta")], axis=-1)
    return LossLaw(*(np.asarray(v) for v in law_from_theta(theta)))


def planes_from_posterior(samples: dict[str, np.ndarray]) -> AcceptancePlane:
    return AcceptancePlane(A=samples["A"], B=samples["B"], C=samples["C"])


class DraftSizeBands(NamedTuple):
    """Posterior summaries over target sizes; quantile arrays have shape (len(quantiles), len(m)).

    Attributes:
      m_target: target sizes M.
      quantiles: the probability levels of the rows below.
      n_star, m_over_n, gamma_star, throughput: quantiles over draws (failed solves excluded).
      failed_fraction: share of draws whose solve did not succeed, per M.
      linear_law: (mu, M0) per draw (NaN where a draw had too few successful solves).
      n_star_draws: N* per draw and M, shape (draws, len(m)).
    """

    m_target: np.ndarray
    quantiles: np.ndarray
    n_star: np.ndarray
    m_over_n: np.ndarray
    gamma_star: np.ndarray
    throughput: np.ndarray
    failed_fraction: np.ndarray
    linear_law: LinearLaw
    n_star_draws: np.ndarray


def propagate_draft_size(
    m_target: ArrayLike,
    laws: LossLaw,
    planes: AcceptancePlane,
    *,
    d_draft: float,
    d_target: float,
    quantiles=(0.05, 0.25, 0.5, 0.75, 0.95),
    chunk_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
    **solver_options,
) -> DraftSizeBands:
    """Push posterior draws through N*(M): bands on N*, M/N*, gamma*, T*, and (mu, M0) draws.

    Args:
      m_target: target sizes (1-D).
      laws: loss-law draws (fields of shape ``(draws,)``) or a single law.
      planes: plane draws (fields ``(draws,)``) or a single plane (e.g. ``SDSL2026``).
      d_draft, d_target: training tokens of draft and target.
      quantiles: probability levels to report.
      chunk_size: draws solved per vectorised call (memory is ``chunk_size x len(m)`` solves).
      progress: called as ``progress(done_draws, total_draws)``.
    """
    m = np.asarray(m_target, np.float64)
    num_draws = max(np.size(laws.E), np.size(planes.A))
    laws = LossLaw(*(np.broadcast_to(np.asarray(v, np.float64), (num_draws,)) for v in laws))
    planes = AcceptancePlane(*(np.broadcast_to(np.asarray(v, np.float64), (num_draws,)) for v in planes))
    outputs = {k: [] for k in ("n_star", "gamma_star", "throughput")}
    for start in range(0, num_draws, chunk_size):
        stop = min(start + chunk_size, num_draws)
        idx = np.resize(np.arange(start, stop), chunk_size)  # fixed shape: one compilation
        sol = solve_draft_size(
            m[None, :], d_draft=d_draft, d_target=d_target,
            loss=LossLaw(*(v[idx][:, None] for v in laws)),
            plane=AcceptancePlane(*(v[idx][:, None] for v in planes)), **solver_options,
        )
        for k in outputs:
            outputs[k].append(np.asarray(getattr(sol, k))[: stop - start])
        if progress is not None:
            progress(stop, num_draws)
    n_star, gamma, thr = (np.concatenate(outputs[k]) for k in ("n_star", "gamma_star", "throughput"))
    q = np.asarray(quantiles)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN quantiles
        quant = lambda x: np.nanquantile(x, q, axis=0)  # noqa: E731
        law = jax.vmap(fit_linear_law, (None, 0))(jnp.asarray(m), jnp.asarray(n_star))
    enough = np.isfinite(n_star).sum(1) >= 2
    law = LinearLaw(np.where(enough, law.mu, np.nan), np.where(enough, law.m0, np.nan))
    return DraftSizeBands(m, q, quant(n_star), quant(m / n_star), quant(gamma), quant(thr),
                          np.mean(~np.isfinite(n_star), axis=0), law, n_star)


def plane_sensitivity(
    m_target: ArrayLike, *, law: LossLaw, plane: AcceptancePlane, d_draft: float, d_target: float
) -> dict[str, np.ndarray]:
    """Elasticities ``d log N* / d log |theta|`` for theta = A, B, C, by implicit derivatives.

    An elasticity of -7 means a 1% larger |A| gives a 7% different N* (here: smaller).
    """
    m = jnp.asarray(m_target, jnp.float64)

    def log_n_star(p):
        return jnp.log(solve_draft_size(m, d_draft=d_draft, d_target=d_target, loss=law, plane=AcceptancePlane(*p)).n_star)

    p = jnp.asarray([plane.A, plane.B, plane.C], jnp.float64)
    jac = jax.jacfwd(log_n_star)(p)  # (len(m), 3)
    return {name: np.asarray(jac[:, i] * p[i]) for i, name in enumerate(("A", "B", "C"))}


def interval_coverage(draws: np.ndarray, truth: float, *, level: float = 0.9) -> bool:
    """Whether ``truth`` lies in the central ``level`` interval of ``draws``."""
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return bool(lo <= truth <= hi)


def save_inference_data(idata: az.InferenceData, path: str | os.PathLike) -> None:
    """Write the posterior as netCDF, atomically."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    idata.to_netcdf(tmp)
    os.replace(tmp, path)
