"""Which draft to train: the Bayes decision over candidates, simple baselines, and forecast scores.

A forecast for one target is a probability over its candidate drafts of being the best (the
highest measured tokens per FLOP). The method's comes from posterior-predictive draws of each
candidate's T (:func:`sdsl_jax.predict.ranking.throughput_draws`); the baselines' from rules a lab could
apply without any fit. Each is scored, once the candidates are measured, by the log score and
the Brier score of the measured best and by the regret of acting on it.

* :func:`bayes_decision` -- the candidate with the highest posterior-expected T (the decision
  that maximises expected throughput), with its P(best) and expected regret.
* :func:`baseline_forecasts` -- uniform; the smallest draft; the previous target's best (half on it,
  half on one size up); a fixed M/N ratio fitted on earlier targets.
* :func:`forecast_scores` -- log score, Brier score and regret against the measured T.
* :func:`reliability` -- the reliability diagram and expected calibration error of many forecasts.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

__all__ = ["Decision", "Forecast", "ForecastScore", "Reliability", "bayes_decision", "baseline_forecasts",
           "forecast_scores", "reliability"]


class Decision(NamedTuple):
    """The Bayes decision among candidates.

    Attributes:
      choice: index of the candidate with the highest posterior-expected T.
      expected_throughput: E[T] per candidate over the draws (a draw where a candidate is
        inadmissible counts as T = 0: speculative decoding with it does not work).
      p_best: P(best) per candidate (share of the draws it wins; draws where none is admissible
        left out).
      expected_regret: E[1 - T_choice / max_j T_j] over the draws: what the decision gives up.
    """

    choice: int
    expected_throughput: np.ndarray
    p_best: np.ndarray
    expected_regret: float


def bayes_decision(t_draws: np.ndarray) -> Decision:
    """The candidate maximising posterior-expected T from ``(draws, candidates)`` throughputs (NaN: inadmissible)."""
    t = np.asarray(t_draws, np.float64)
    if t.ndim != 2 or t.shape[1] == 0:
        raise ValueError(f"t_draws must have shape (draws, candidates), got {t.shape}")
    finite = np.isfinite(t)
    t0 = np.where(finite, t, 0.0)
    expected = t0.mean(axis=0)
    choice = int(np.argmax(expected))
    some = finite.any(axis=1)
    winner = np.argmax(np.where(finite, t, -np.inf), axis=1)
    p_best = np.array([np.mean(winner[some] == j) if some.any() else np.nan for j in range(t.shape[1])])
    best = t0.max(axis=1)
    regret = np.where(best > 0, 1.0 - t0[:, choice] / np.where(best > 0, best, 1.0), 0.0)
    return Decision(choice, expected, p_best, float(regret.mean()))


class Forecast(NamedTuple):
    """A probability over the candidates of being the best, and the rule that gave it."""

    name: str
    p_best: np.ndarray
    rule: str


def _nearest(log_n: np.ndarray, value: float) -> int:
    return int(np.argmin(np.abs(log_n - np.log(value))))


def baseline_forecasts(n_candidates: Sequence[float], m_target: float, *,
                       previous_best: float | None = None,
                       earlier: Sequence[tuple[float, float]] = ()) -> list[Forecast]:
    """Forecasts a lab could make without fitting anything, for one target.

    Args:
      n_candidates: the candidates' sizes N (any order).
      m_target: the target's size M.
      previous_best: the size of the measured best draft of the next smaller target (None: the
        first target; the rule then falls back to uniform).
      earlier: ``(M, N_best)`` of the earlier targets; the ratio rule predicts
        ``N = M / exp(mean log(M / N_best))`` and puts all mass on the candidate nearest in log N
        (uniform without earlier targets).

    Returns:
      ``uniform``, ``smallest``, ``previous-best`` and ``fixed-ratio`` forecasts.
    """
    n = np.asarray(n_candidates, np.float64)
    k = n.size
    uniform = np.full(k, 1.0 / k)
    log_n = np.log(n)
    smallest = np.zeros(k)
    smallest[int(np.argmin(n))] = 1.0
    if previous_best is None:
        previous = uniform.copy()
    else:
        previous = np.zeros(k)
        i = _nearest(log_n, previous_best)
        order = np.argsort(n)
        up = order[min(int(np.flatnonzero(order == i)[0]) + 1, k - 1)]
        previous[i] += 0.5
        previous[up] += 0.5
    if earlier:
        ratio = float(np.exp(np.mean([np.log(m / nb) for m, nb in earlier])))
        fixed = np.zeros(k)
        fixed[_nearest(log_n, m_target / ratio)] = 1.0
        fixed_rule = f"all on the candidate nearest M / {ratio:.3g} (the mean M/N of the earlier targets' best)"
    else:
        fixed, fixed_rule = uniform.copy(), "uniform (no earlier target to fit a ratio on)"
    return [
        Forecast("uniform", uniform, "equal probability on every candidate"),
        Forecast("smallest", smallest, "all on the smallest candidate"),
        Forecast("previous-best", previous, "half on the previous target's measured best, half on one size up"
                 if previous_best is not None else "uniform (no previous target)"),
        Forecast("fixed-ratio", fixed, fixed_rule),
    ]


class ForecastScore(NamedTuple):
    """Scores of one forecast against the measured candidates.

    Attributes:
      log_score: ln P(measured best) (higher is better; -inf for a forecast that excluded it).
      brier: sum over candidates of (p_j - [j is best])^2 (0 perfect, 2 worst).
      regret: 1 - T_measured(most probable) / T_measured(best): the cost of acting on the forecast.
    """

    log_score: float
    brier: float
    regret: float


def forecast_scores(p_best: Sequence[float], t_measured: Sequence[float]) -> ForecastScore:
    """Score a forecast over candidates by the measured T of each (the best is its argmax)."""
    p = np.asarray(p_best, np.float64)
    t = np.asarray(t_measured, np.float64)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(f"p_best {p.shape} and t_measured {t.shape} must be one value per candidate")
    best = int(np.nanargmax(t))
    outcome = np.zeros_like(p)
    outcome[best] = 1.0
    with np.errstate(divide="ignore"):
        log_score = float(np.log(p[best]))
    chosen = int(np.argmax(p))
    return ForecastScore(log_score, float(np.sum((p - outcome) ** 2)), float(1.0 - t[chosen] / t[best]))


class Reliability(NamedTuple):
    """How often forecasts of probability p come true, in equal-width bins of p.

    Attributes:
      bin_edges: ``bins + 1`` edges on [0, 1].
      mean_forecast: per bin, the mean forecast probability (None for an empty bin).
      frequency: per bin, the share of its forecasts that came true (None for an empty bin).
      count: forecasts per bin.
      expected_calibration_error: ``sum_b (n_b / n) |frequency_b - mean_forecast_b|`` (Naeini,
        Cooper & Hauskrecht 2015): 0 for a calibrated forecaster, at the resolution of the bins.
    """

    bin_edges: list
    mean_forecast: list
    frequency: list
    count: list
    expected_calibration_error: float


def reliability(p: Sequence[float], outcome: Sequence[float], *, bins: int = 10) -> Reliability:
    """The reliability diagram's bins and the expected calibration error of forecasts ``p`` of 0/1 ``outcome``."""
    p, outcome = np.asarray(p, np.float64), np.asarray(outcome, np.float64)
    if p.shape != outcome.shape or p.ndim != 1 or p.size == 0:
        raise ValueError(f"p {p.shape} and outcome {outcome.shape} must be equal-length, non-empty vectors")
    if not (np.all((p >= 0) & (p <= 1)) and np.all((outcome == 0) | (outcome == 1))):
        raise ValueError("p must lie in [0, 1] and every outcome be 0 or 1")
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, bins - 1)  # p = 1 in the last bin
    count = np.bincount(which, minlength=bins)
    with np.errstate(invalid="ignore"):
        mean = np.bincount(which, p, minlength=bins) / count
        freq = np.bincount(which, outcome, minlength=bins) / count
    ece = float(np.nansum(count / p.size * np.abs(freq - mean)))

    def listed(x):  # None, not NaN, for an empty bin: the record stays strict JSON
        return [None if np.isnan(v) else float(v) for v in x]

    return Reliability(edges.tolist(), listed(mean), listed(freq), count.tolist(), ece)
