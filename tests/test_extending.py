"""Extending the chain without touching the library: a new loss-law family, a new cost model and a
new acceptance model, each defined in this file alone and run through the pipeline (point fit,
posterior, N* bands, ranking, stacking)."""

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sdsl_jax as sd
from experiments.numpy_reference import argmax_on_log_grid
from sdsl_jax import pipeline
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns
from sdsl_jax.infer.point import huber_objective


# ---- A new loss-law family: Chinchilla with one exponent shared by N and D (30 lines). ----------
class SharedExponentLaw(NamedTuple):
    E: float
    A: float
    B: float
    alpha: float

    def loss(self, n_params, n_tokens):
        n, d = jnp.asarray(n_params), jnp.asarray(n_tokens)
        return self.E + self.A / n**self.alpha + self.B / d**self.alpha


def shared_prior(centre):
    import numpyro
    import numpyro.distributions as dist

    # Each term's size stated at the data's centre, as the shipped families do.
    alpha = numpyro.sample("alpha", dist.LogNormal(jnp.log(0.35), 0.5))
    a_ref = numpyro.sample("a_ref", dist.Normal(-1.0, 2.0))
    b_ref = numpyro.sample("b_ref", dist.Normal(-1.0, 2.0))
    e = numpyro.sample("e", dist.Normal(0.5, 1.0))
    a = numpyro.deterministic("a", a_ref + alpha * centre.log_n)
    b = numpyro.deterministic("b", b_ref + alpha * centre.log_d)
    return jnp.stack([a, b, e, alpha])


SHARED = sd.LossLawFamily(
    name="shared-exponent", law_type=SharedExponentLaw, theta_names=("a", "b", "e", "alpha"),
    from_theta=lambda t: SharedExponentLaw(jnp.exp(t[..., 2]), jnp.exp(t[..., 0]), jnp.exp(t[..., 1]), t[..., 3]),
    to_theta=lambda law: jnp.stack([jnp.log(law.A), jnp.log(law.B), jnp.log(law.E), jnp.asarray(law.alpha)]),
    start_grid=np.array(list(itertools.product([4.0, 8.0], [4.0, 8.0], [0.0, 0.5], [0.2, 0.4]))),
    prior=shared_prior,  # no log_loss: the family's default, log(law.loss(N, D)), is used
)


# ---- A new cost model: verification grows quadratically with the positions verified. ------------
class QuadraticVerification(NamedTuple):
    flops_per_param: float = 2.0
    crowding: float = 0.01  # extra cost per squared verified position (attention, cache traffic)

    def draft_step(self, n):
        return self.flops_per_param * n

    def verification(self, m, k):
        return self.flops_per_param * m * (1.0 + self.crowding * k**2)


# ---- A new acceptance model: alpha falls with the loss gap between draft and target. ------------
class GapPlane(NamedTuple):
    """``alpha = A (ln x - ln y) + B ln y + C``: the draft's excess loss over the target, and the target's loss."""

    A: float
    B: float
    C: float
    link = "identity"

    def rate(self, ppl_draft, ppl_target):
        lx, ly = jnp.log(jnp.asarray(ppl_draft)), jnp.log(jnp.asarray(ppl_target))
        return self.A * (lx - ly) + self.B * ly + self.C

    predictor = rate


GAP = sd.AcceptanceModel("gap-plane", GapPlane, lambda x, y: (jnp.log(x) - jnp.log(y), jnp.log(y)),
                         "alpha = A (ln x - ln y) + B ln y + C")
TRUE_GAP = GapPlane(A=-0.9, B=-0.05, C=0.85)


TRUE_SHARED = SharedExponentLaw(E=1.8, A=400.0, B=1500.0, alpha=0.33)


def synthetic_runs(law, *, seed=0, sigma=0.01):
    rng = np.random.default_rng(seed)
    n = np.repeat(np.geomspace(7e7, 1.6e10, 8), 6)
    d = n * np.tile(np.geomspace(5.0, 80.0, 6), 8)
    loss = np.asarray(law.loss(n, d)) * np.exp(rng.normal(0.0, sigma, n.size))
    return PretrainingRuns(n_params=n, n_tokens=d, loss=loss, name=(None,) * n.size, flops=np.full(n.size, np.nan),
                           source=(None,) * n.size)


@pytest.fixture(scope="module")
def extended_run():
    """The pipeline with the family and the cost model of this file: point fit, posterior, bands."""
    runs = synthetic_runs(TRUE_SHARED)
    return pipeline.run(runs, m_grid=np.linspace(1e10, 1e11, 2), targets=np.array([3e10, 7e10]), d_target=1e12,
                        d_draft=1e12, family=SHARED, cost=QuadraticVerification(), posterior=True, num_chains=2,
                        num_warmup=120, num_samples=120, seed=1)


def test_a_new_loss_law_family_runs_through_the_pipeline(extended_run):
    point, posterior = extended_run.point, extended_run.posterior
    assert isinstance(point.law, SharedExponentLaw) and point.converged
    # The fit is at least as good as the truth on its own objective, and close to it.
    runs = synthetic_runs(TRUE_SHARED)
    data = (np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss), 1e-3)
    objective = huber_objective(SHARED)
    assert objective(point.theta, *data) <= objective(SHARED.to_theta(TRUE_SHARED), *data) + 1e-12
    np.testing.assert_allclose(point.law.alpha, TRUE_SHARED.alpha, rtol=0.15)
    np.testing.assert_allclose(point.law.E, TRUE_SHARED.E, rtol=0.1)
    assert posterior.law_run.samples["alpha"].shape == (240,)
    assert posterior.diagnostics.plane is None and [name for name, _ in posterior.diagnostics.items()] == ["loss_law"]  # the paper's plane, fixed
    assert isinstance(posterior.laws, SharedExponentLaw) and np.shape(posterior.laws.E) == (240,)
    named, bands = extended_run.prediction.named, extended_run.prediction.target_bands
    assert np.all(np.asarray(named.status) == sd.SolveStatus.SUCCESS)
    q = list(bands.quantiles)
    lo, hi = bands.n_star[q.index(0.05)], bands.n_star[q.index(0.95)]
    assert np.all(lo < hi) and np.all((lo <= named.n_star * 1.02) & (named.n_star <= hi * 1.02))
    # The true law's N* (under the same cost) lies in the posterior band.
    truth = sd.optimal_draft_size(np.array([3e10, 7e10]), d_draft=1e12, d_target=1e12, loss=TRUE_SHARED,
                                  cost=QuadraticVerification())
    assert np.all((lo <= truth) & (truth <= hi))


def test_a_new_cost_model_runs_through_the_pipeline_and_matches_brute_force(extended_run):
    cost = QuadraticVerification()
    law, plane = extended_run.point.law, extended_run.point.plane
    sol = extended_run.prediction.named
    for i, m in enumerate([3e10, 7e10]):
        objective = jax.jit(lambda n, m=m: sd.draft_throughput(n, m, d_draft=1e12, d_target=1e12, loss=law,
                                                               plane=plane, cost=cost))
        brute = argmax_on_log_grid(objective, 1e5, m, points=801)
        np.testing.assert_allclose(sol.n_star[i], brute, rtol=1e-3)
        # gamma* at N* is the maximiser of the iteration's throughput under this cost.
        gammas = np.linspace(0.0, 40.0, 40001)
        t = sd.throughput_under(cost, sol.alpha[i], gammas, sol.n_star[i], m)
        assert abs(float(sol.gamma_star[i]) - gammas[int(np.argmax(t))]) < 2e-3
    # The cost changes the answer: under SDSL FLOPs the same law wants another draft.
    flops = sd.optimal_draft_size(7e10, d_draft=1e12, d_target=1e12, loss=law, plane=plane)
    assert abs(float(flops) / float(sol.n_star[1]) - 1) > 0.05
    bands = extended_run.prediction.target_bands
    assert np.all(np.isfinite(bands.n_star)) and np.all(bands.failed_fraction == 0.0)


class SDSLFlopsNumerically(NamedTuple):
    """SDSL's cost without ``affine``: forces the numerical lookahead solve."""

    flops_per_param: float = 2.0

    def draft_step(self, n):
        return self.flops_per_param * n

    def verification(self, m, k):
        return self.flops_per_param * m + 0.0 * k


def test_numerical_lookahead_equals_the_lambert_w_closed_form():
    # (alpha, M/N): docs/theory.md's check values, a small ratio, and one where drafting does not pay.
    alpha = np.array([0.70, 0.65, 0.8, 0.5, 0.3, 0.05])
    n, m = np.ones(6), np.array([100.0, 200.0, 20.0, 10.0, 1.5, 3.0])
    closed = sd.best_lookahead(sd.SDSL_FLOPS, alpha, n, m)
    numeric = sd.best_lookahead(SDSLFlopsNumerically(), alpha, n, m)
    np.testing.assert_allclose(numeric.gamma, closed.gamma, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(numeric.throughput, closed.throughput, rtol=1e-12)
    assert closed.gamma[-1] == 0.0
    # Implicit derivatives of gamma* agree with the closed form's (elementwise, so the sum's gradient).
    def grads(cost):
        return jax.jit(jax.grad(lambda *a: sd.best_lookahead(cost, *a).gamma.sum(), argnums=(0, 2)))(alpha, n, m)

    for g_num, g_closed in zip(grads(SDSLFlopsNumerically()), grads(sd.SDSL_FLOPS)):
        np.testing.assert_allclose(g_num, g_closed, rtol=1e-6, atol=1e-12)


def test_numerical_lookahead_gradient_matches_finite_differences():
    cost = QuadraticVerification(crowding=0.02)

    def gamma(c):
        return sd.best_lookahead(QuadraticVerification(crowding=c), 0.75, 1e8, 3e10).gamma

    eps = 1e-6
    fd = (gamma(0.02 + eps) - gamma(0.02 - eps)) / (2 * eps)
    np.testing.assert_allclose(jax.grad(gamma)(0.02), fd, rtol=1e-5)
    # Drafting pays iff d log T / d gamma > 0 at gamma = 0: -alpha log(alpha) / (1 - alpha) against the
    # cost's relative growth (2N + 4 c M) / (2M (1 + c)) = 0.0425 here.
    assert float(sd.best_lookahead(cost, 0.001, 1e8, 3e10).gamma) == 0.0
    assert float(sd.best_lookahead(cost, 0.01, 1e8, 3e10).gamma) > 0.0
    assert np.isnan(sd.best_lookahead(cost, 1.2, 1e8, 3e10).gamma)


def gap_pairs(law, *, seed=2, sigma=0.01):
    """Every (draft, target) pair of eight model sizes, their perplexities from ``law`` and alpha from
    :data:`TRUE_GAP` with a little noise."""
    rng = np.random.default_rng(seed)
    sizes, d = np.geomspace(7e7, 1.6e10, 8), 1e12
    pairs = [(i, j) for j in range(len(sizes)) for i in range(j)]
    n, m = sizes[[i for i, _ in pairs]], sizes[[j for _, j in pairs]]
    x, y = np.exp(np.asarray(law.loss(n, d))), np.exp(np.asarray(law.loss(m, d)))
    alpha = np.clip(np.asarray(TRUE_GAP.rate(x, y)) + rng.normal(0.0, sigma, len(pairs)), 0.01, 0.99)
    nan = np.full(len(pairs), np.nan)
    return AcceptanceMeasurements(
        draft=tuple(f"d{i}" for i, _ in pairs), target=tuple(f"t{j}" for _, j in pairs), n_draft=n, n_target=m,
        d_draft=np.full(len(pairs), d), d_target=np.full(len(pairs), d), ppl_draft=x, ppl_target=y, alpha=alpha,
        gamma=nan, n_iterations=nan, accepted=nan, weight=nan, temperature=np.ones(len(pairs)),
        source=(None,) * len(pairs))


def test_a_new_acceptance_model_runs_through_the_pipeline_ranking_and_stacking(extended_run):
    """The acceptance model of this file, on pairs of models of this file's loss law: its point fit and
    posterior (beside the law's posterior of the extended run), P(best) from both, and stacking
    against the paper's plane."""
    from sdsl_jax import compare, predict

    runs, pairs = synthetic_runs(TRUE_SHARED), gap_pairs(TRUE_SHARED)
    base = extended_run.point
    point = pipeline.fit_point(runs, pairs, family=SHARED, acceptance_model=GAP, starts=SHARED.start_grid)
    assert isinstance(point.plane, GapPlane) and point.plane_fitted and point.plane_r_squared > 0.9
    np.testing.assert_allclose(point.plane, TRUE_GAP, atol=0.05)
    np.testing.assert_allclose(point.theta, base.theta)  # the same law: only the acceptance model is new
    kw = dict(law_run=extended_run.posterior.law_run, num_chains=2, num_warmup=150, num_samples=150, seed=3,
              model_effects=False)
    posterior = pipeline.sample_posterior(runs, pairs, point, **kw)
    assert isinstance(posterior.planes, GapPlane) and posterior.planes.A.shape == (300,)
    assert posterior.diagnostics.plane is not None
    for k in ("A", "B", "C"):  # the posterior covers the truth
        lo, hi = np.quantile(posterior.plane_run.samples[k], [0.005, 0.995])
        assert lo <= getattr(TRUE_GAP, k) <= hi, k
    draws = predict.paired_draws(posterior, count=200)
    ranking = predict.rank_drafts(point, n_drafts=np.array([1e8, 1e9, 5e9]), d_drafts=np.full(3, 1e12),
                                  m_target=7e10, d_target=1e12, draws=draws,
                                  scales=predict.predictive_scales(posterior, count=200))
    assert np.isclose(ranking.p_best.sum(), 1.0) and ranking.best is not None
    bands = predict.propagate_draft_size(np.array([7e10]), draws[0], draws[1], d_draft=1e12, d_target=1e12)
    assert np.isfinite(np.asarray(bands.n_star)).all()
    # Compared with the paper's plane on the same pairs, the model the data came from carries the weight.
    plane_post = pipeline.sample_posterior(runs, pairs, point._replace(acceptance_model=sd.PLANE), **kw)
    weights = compare.acceptance_stacking_weights(pairs, {"gap-plane": posterior.plane_run,
                                                          "plane": plane_post.plane_run},
                                                  models={"gap-plane": GAP, "plane": sd.PLANE})
    assert dict(zip(weights.names, weights.weights))["gap-plane"] > 0.5


def test_every_shipped_link_and_the_new_ones_here_meet_the_chain_protocols():
    import sdsl_jax as sd

    laws = [sd.HOFFMANN2022, sd.BESIROGLU2024, SharedExponentLaw(1.7, 400.0, 400.0, 0.3)]
    for law in laws:
        assert isinstance(law, sd.LossLawModel)
    for plane in (sd.SDSL2026, sd.LogPerplexityPlane(-0.3, 0.2, 0.8), sd.LogitPlane(-1.0, 1.0, 1.0), TRUE_GAP):
        assert isinstance(plane, sd.AcceptanceRateModel)
    for cost in (*sd.COST_MODELS.values(), QuadraticVerification(), SDSLFlopsNumerically()):
        assert isinstance(cost, sd.IterationCostModel)
    for recipe in (sd.FixedTokens(1e12), sd.TokensPerParameter(20.0), sd.FixedCompute(1e21)):
        assert isinstance(recipe, sd.DraftRecipe)
    # A value without the method is not mistaken for a link.
    assert not isinstance(sd.SDSL2026, sd.LossLawModel) and not isinstance(sd.HOFFMANN2022, sd.IterationCostModel)
