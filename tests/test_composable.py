"""The chain's links one by one: loss-law families, acceptance models, cost models, recipes, and
their composition in the N* solve, each against an independent oracle."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sdsl_jax as sd
from experiments.numpy_reference import argmax_on_log_grid
from sdsl_jax.data import load_speculative

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAWS = {
    "chinchilla": sd.BESIROGLU2024,
    "kaplan": sd.KAPLAN2020,
    "broken": sd.BrokenPowerLaw(E=1.7, A=400.0, alpha=0.34, B=1500.0, beta=0.3, D_break=1e10, c=0.2, f=0.5),
    "data": sd.DataLaw(E=1.8, B=2000.0, beta=0.36),
}


@pytest.mark.parametrize("name", sorted(sd.FAMILIES))
def test_family_coordinates_round_trip_and_match_the_law(name):
    family, law = sd.FAMILIES[name], LAWS[name]
    assert sd.family_of(law) is family
    theta = family.to_theta(law)
    assert theta.shape == (family.num_params,)
    back = family.from_theta(theta)
    np.testing.assert_allclose(np.asarray(back), np.asarray(law, dtype=float), rtol=1e-12)
    n, d = np.geomspace(1e6, 1e11, 5)[:, None], np.geomspace(1e8, 1e13, 4)[None, :]
    np.testing.assert_allclose(np.exp(family.log_prediction(theta, np.log(n), np.log(d))), law.loss(n, d),
                               rtol=1e-12)
    assert np.isnan(law.loss(0.0, 1e9)) and np.isnan(law.loss(1e9, -1.0))
    # Batched theta (posterior draws) gives a law of arrays.
    draws = family.from_theta(jnp.stack([theta] * 3))
    assert np.shape(draws[0]) == (3,)


def test_shipped_formulas_against_their_papers():
    n, d = 3e9, 6e10
    k = sd.KAPLAN2020
    want = ((k.N_c / n) ** (k.alpha_N / k.alpha_D) + k.D_c / d) ** k.alpha_D  # Kaplan et al. eq. 1.5
    np.testing.assert_allclose(k.loss(n, d), want, rtol=1e-13)
    b = LAWS["broken"]
    want = b.E + b.A / n**b.alpha + b.B * d**-b.beta * (1 + (d / b.D_break) ** (1 / b.f)) ** (-b.c * b.f)
    np.testing.assert_allclose(b.loss(n, d), want, rtol=1e-13)
    np.testing.assert_allclose(LAWS["data"].loss(n, d), 1.8 + 2000.0 / d**0.36, rtol=1e-14)


@pytest.mark.slow  # 10-20 s each; the default run fits a family defined in test_extending through the pipeline
@pytest.mark.parametrize("name", ["kaplan", "broken", "data"])
def test_each_family_is_recovered_by_its_point_fit(name):
    family, law = sd.FAMILIES[name], LAWS[name]
    rng = np.random.default_rng(0)
    n = np.repeat(np.geomspace(1e7, 1e10, 7), 7)
    d = np.tile(np.geomspace(1e8, 1e12, 7), 7)
    loss = np.asarray(law.loss(n, d)) * np.exp(rng.normal(0, 1e-3, n.size))
    starts = family.starts(np.log(n), np.log(d), np.log(loss))
    fit = sd.fit_loss_law(n, d, loss, family=family, starts=starts[:: max(1, len(starts) // 150)])
    assert isinstance(fit.law, family.law_type) and fit.family is family
    pred = np.asarray(fit.law.loss(n, d))
    assert np.sqrt(np.mean(np.log(pred / loss) ** 2)) < 1.2e-3  # fits to the noise level (1e-3)


def test_log_plane_fit_recovers_its_coefficients():
    rng = np.random.default_rng(1)
    x, y = rng.uniform(3, 40, 60), rng.uniform(2, 12, 60)
    truth = sd.LogPerplexityPlane(A=-0.1, B=0.12, C=0.8)
    alpha = np.asarray(truth.rate(x, y)) + rng.normal(0, 1e-4, 60)
    fit = sd.fit_acceptance_plane(x, y, alpha, model=sd.LOG_PLANE)
    assert isinstance(fit.plane, sd.LogPerplexityPlane)
    np.testing.assert_allclose(np.asarray(fit.plane), np.asarray(truth), atol=2e-4)
    np.testing.assert_allclose(truth.rate(8.0, 4.0), -0.1 * np.log(8) + 0.12 * np.log(4) + 0.8, rtol=1e-14)
    assert np.isnan(truth.rate(0.5, 4.0))


COSTS = [sd.SDSL_FLOPS, sd.AllPositionsFlops(), sd.LatencyCost(draft_fixed=1e-4, draft_per_param=2e-10,
                                                                verify_fixed=2e-4, verify_per_param=2e-10,
                                                                verify_per_token=3e-12)]


@pytest.mark.parametrize("cost", COSTS, ids=lambda c: type(c).__name__)
def test_closed_form_lookahead_is_the_argmax_of_throughput(cost):
    """gamma* from the Lambert W closed form against a dense grid of T(gamma) under each cost."""
    gammas = np.linspace(0, 60, 600001)
    for alpha, n, m in [(0.8, 1e7, 3e9), (0.65, 1e8, 7e10), (0.9, 5e6, 1e9)]:
        best = sd.best_lookahead(cost, alpha, n, m)
        t = np.asarray(sd.throughput_under(cost, alpha, gammas, n, m))
        assert abs(float(best.gamma) - gammas[np.argmax(t)]) <= 2e-4
        np.testing.assert_allclose(best.throughput, t.max(), rtol=1e-9)


def test_all_positions_cost_never_pays_in_flops():
    """Charged per verified position, speculative decoding always costs more FLOPs than it saves:
    E[tokens] <= gamma + 1 while the target alone pays 2M for each of them."""
    sol = sd.solve_draft_size(3e10, d_target=1e12, d_draft=1e12, loss=sd.BESIROGLU2024, cost=sd.AllPositionsFlops())
    assert int(sol.status) == sd.SolveStatus.NO_SPEEDUP and np.isnan(sol.n_star)


def test_all_positions_cost_is_leviathans_operations_count():
    """T under the all-positions count = 1 / (ops factor x target's cost per token) [Leviathan Thm 3.11]."""
    alpha, gamma, n, m = 0.7, 4.0, 1e8, 1e10
    t = sd.throughput_under(sd.AllPositionsFlops(), alpha, gamma, n, m)
    ops = sd.operations_factor(alpha, gamma, n / m)
    np.testing.assert_allclose(t, 1.0 / (ops * 2 * m), rtol=1e-13)


@pytest.mark.parametrize("recipe", [sd.TokensPerParameter(20.0), sd.FixedCompute(1e21), sd.FixedTokens(2e11)],
                         ids=lambda r: type(r).__name__)
def test_recipes_give_the_brute_force_optimum(recipe):
    m = 3e10
    sol = sd.solve_draft_size(m, d_target=1e12, recipe=recipe, loss=sd.BESIROGLU2024)
    assert int(sol.status) == sd.SolveStatus.SUCCESS, sd.status_message(sol.status)

    objective = jax.jit(lambda n: sd.draft_throughput(n, m, d_target=1e12, recipe=recipe, loss=sd.BESIROGLU2024))
    brute = argmax_on_log_grid(objective, 1e3, m)
    np.testing.assert_allclose(sol.n_star, brute, rtol=1e-4)
    np.testing.assert_allclose(recipe.draft_tokens(1e8) * (1e8 if isinstance(recipe, sd.FixedCompute) else 1),
                               {sd.TokensPerParameter: 2e9, sd.FixedCompute: 1e21 / 6, sd.FixedTokens: 2e11}[
                                   type(recipe)], rtol=1e-14)


def test_n_star_derivative_with_respect_to_the_recipe_and_the_cost():
    def n_star(rho, fpp):
        return sd.optimal_draft_size(3e10, d_target=1e12, recipe=sd.TokensPerParameter(rho),
                                     cost=sd.SDSLFlops(fpp), loss=sd.BESIROGLU2024)

    g = jax.grad(n_star, argnums=(0, 1))(20.0, 2.0)
    eps = 1e-4
    fd_rho = (n_star(20.0 * (1 + eps), 2.0) - n_star(20.0 * (1 - eps), 2.0)) / (2 * 20.0 * eps)
    np.testing.assert_allclose(g[0], fd_rho, rtol=1e-4)
    assert abs(float(g[1])) < 1e-6 * float(n_star(20.0, 2.0))  # a common factor of all costs moves nothing


def test_d_draft_and_recipe_are_exclusive_and_recipe_fields_are_checked():
    with pytest.raises(ValueError, match="exactly one of d_draft"):
        sd.solve_draft_size(3e10, d_target=1e12, d_draft=1e12, recipe=sd.TokensPerParameter(20.0))
    with pytest.raises(ValueError, match="recipe.ratio must be > 0"):
        sd.solve_draft_size(3e10, d_target=1e12, recipe=sd.TokensPerParameter(-1.0))
    with pytest.raises(ValueError, match="cost.flops_per_param must be finite"):
        sd.solve_draft_size(3e10, d_target=1e12, d_draft=1e12, cost=sd.SDSLFlops(float("nan")))


def test_status_codes_carry_a_message():
    for status in sd.SolveStatus:
        assert status.message and sd.status_message(int(status)) == status.message
    sol = sd.solve_draft_size(5e10, d_draft=8e11, d_target=1.2e12, plane=sd.AcceptancePlane(-0.0067, 0.01297, -5.0))
    assert "no admissible draft" in sd.status_message(sol.status)


def test_importing_the_clis_changes_no_global_jax_state():
    code = "import jax, experiments.fit, experiments.closure, experiments.calibration, experiments.bench; " \
           "import sdsl_jax.pipeline, sdsl_jax.figures; print(jax.config.jax_enable_x64)"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", code + "; import os; print(os.environ.get('XLA_FLAGS'))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "None"]


def test_committed_speculative_runs_follow_their_schema():
    runs = load_speculative(os.path.join(REPO, "fits", "ladder-v1", "speculative.csv"))
    assert len(runs) == 126 and set(runs.gamma) == {1, 2, 4, 6, 8, 10}
    # Per-prompt counts (the closure's bootstrap over prompts) add up to each row's totals.
    for i in range(len(runs)):
        iterations = [int(v) for v in runs.iterations_per_prompt[i].split(";")]
        accepted = [int(v) for v in runs.accepted_per_prompt[i].split(";")]
        assert len(iterations) == len(accepted) == runs.prompts[i]
        assert sum(iterations) == runs.iterations[i] and sum(accepted) == runs.accepted[i]
    # The MLE recomputed from the histograms (accepted counts per iteration) is the stored one.
    for i in range(len(runs)):
        counts = np.array([int(c) for c in runs.histogram[i].split(";")])
        k = np.arange(counts.size)
        rejected = counts[:-1].sum()
        np.testing.assert_allclose((counts * k).sum() / ((counts * k).sum() + rejected), runs.alpha_mle[i],
                                   rtol=1e-12)
    with open(os.path.join(REPO, "fits", "ladder-v1", "measure.json")) as f:
        assert json.load(f)  # the provenance beside it parses
