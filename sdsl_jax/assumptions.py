"""What a prediction assumes, where each setting comes from, and where it extrapolates.

A run on a user's data answers on that data's terms: the draft and target budgets D and D' and
the targets come from the acceptance measurements (or from flags), never from another dataset's
defaults (:func:`settings_from_data`). Every prediction then says how far it reaches beyond what
was measured (:func:`extrapolation`), and whether the law's perplexities are on the scale of the
measured ones the acceptance model was fitted to (:func:`perplexity_scale`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = [
    "Setting",
    "AnalysisSettings",
    "SettingsError",
    "settings_from_data",
    "Extrapolation",
    "extrapolation",
    "PerplexityScale",
    "perplexity_scale",
    "unlabelled_repeats",
    "format_assumptions",
]

_SAME = 1e-9  # relative spread below which a column holds one value


class SettingsError(ValueError):
    """A setting the data cannot supply; the message names the flag that gives it."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """A value and where it came from (a flag, the data, a shipped dataset's default)."""

    value: Any
    source: str


@dataclasses.dataclass(frozen=True)
class AnalysisSettings:
    """The budgets and targets a prediction is made for, each with its source."""

    d_draft: Setting
    d_target: Setting
    targets: Setting
    m_range: Setting

    def as_dict(self) -> dict:
        return {name: dict(value=_plain(getattr(self, name).value), source=getattr(self, name).source)
                for name in ("d_draft", "d_target", "targets", "m_range")}


def _plain(value):
    if isinstance(value, (tuple, list, np.ndarray)):
        return [float(v) for v in value]
    return None if value is None else float(value)


def _single(values: np.ndarray) -> float | None:
    values = np.asarray(values, np.float64)
    if values.size and np.ptp(values) <= _SAME * np.max(np.abs(values)):
        return float(values[0])
    return None


def settings_from_data(
    acceptance=None,
    *,
    d_draft: float | None = None,
    d_target: float | None = None,
    targets=None,
    m_min: float | None = None,
    m_max: float | None = None,
    needs_d_draft: bool = True,
    source: str = "the acceptance data",
) -> AnalysisSettings:
    """The settings of a run on the user's own data: each from its flag, else from the data.

    Args:
      acceptance: the acceptance measurements (:class:`~sdsl_jax.data.AcceptanceMeasurements`), or
        None when only pre-training runs are given (they say nothing about the draft and target
        one will train, so every setting must then come from a flag).
      d_draft, d_target, targets, m_min, m_max: the flags' values (None: not given).
      needs_d_draft: False when the draft recipe does not use one budget for every draft.
      source: how to name the acceptance data in the sources (its file).

    Returns:
      :class:`AnalysisSettings`. D and D' are the acceptance rows' ``d_draft`` / ``d_target`` where
      every row has the same one; the named targets are the measured target sizes; the N*(M) grid
      spans them (a factor of two either side of a single target).

    Raises:
      SettingsError: naming the flag to give, where the data hold several values or none.
    """
    def budget(flag, value, column, what):
        if value is not None:
            return Setting(float(value), flag)
        if acceptance is None:
            raise SettingsError(f"give {flag}: the {what} is not in pre-training runs (give --acceptance data whose "
                                f"{column} column says it, or the flag)")
        one = _single(getattr(acceptance, column))
        if one is None:
            values = np.unique(getattr(acceptance, column))
            raise SettingsError(f"give {flag}: {source} hold {len(values)} different {column} values "
                                f"({values.min():.3g} to {values.max():.3g}); which one to predict for is yours to say")
        return Setting(one, f"{source} (column {column}, every row)")

    d_draft_setting = (budget("--d-draft", d_draft, "d_draft", "draft's training budget D") if needs_d_draft
                       else Setting(None, "the draft recipe (--recipe)"))
    d_target_setting = budget("--d-target", d_target, "d_target", "target's training budget D'")
    if targets is not None:
        target_setting = Setting(tuple(float(t) for t in targets), "--targets")
    elif acceptance is not None:
        target_setting = Setting(tuple(float(t) for t in np.unique(acceptance.n_target)),
                                 f"{source} (the measured targets, column n_target)")
    else:
        raise SettingsError("give --targets: the pre-training runs do not say which target sizes to predict for")
    named = np.asarray(target_setting.value)
    if m_min is not None and m_max is not None:
        m_range = Setting((float(m_min), float(m_max)), "--m-min, --m-max")
    else:
        lo, hi = (named.min(), named.max()) if named.max() > named.min() else (named.min() / 2, named.max() * 2)
        lo, hi = (m_min if m_min is not None else lo), (m_max if m_max is not None else hi)
        if not lo < hi:
            raise SettingsError(f"give --m-min and --m-max: the targets' range [{lo:.3g}, {hi:.3g}] is empty")
        m_range = Setting((float(lo), float(hi)), "the named targets' range" + (
            " (a factor of two either side of the one target)" if named.max() == named.min() else ""))
    return AnalysisSettings(d_draft_setting, d_target_setting, target_setting, m_range)


@dataclasses.dataclass(frozen=True)
class Extrapolation:
    """How far a target and its N* lie beyond the data, per target (factors > 1 are beyond).

    Attributes:
      target_over_runs: M over the largest pre-training run's size.
      target_over_measured: M over the largest measured target (NaN without acceptance data).
      n_star_outside_drafts: how far N* lies outside the measured drafts' range (1: inside).
      n_star_outside_runs: how far N* lies outside the pre-training sizes (1: inside).
      flags: one short phrase per factor above 1, for the table.
    """

    target_over_runs: float
    target_over_measured: float
    n_star_outside_drafts: float
    n_star_outside_runs: float
    flags: tuple[str, ...]

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else (float(v) if np.isfinite(v) else None))
                for k, v in dataclasses.asdict(self).items()}


def _outside(x: float, lo: float, hi: float) -> float:
    if not np.isfinite(x):
        return float("nan")
    return max(x / hi, lo / x, 1.0)


def extrapolation(m_target: float, n_star: float, *, run_sizes, draft_sizes=None, target_sizes=None,
                  tolerance: float = 1.05) -> Extrapolation:
    """How far ``m_target`` and ``n_star`` reach beyond the sizes in the data.

    A factor counts as extrapolation above ``tolerance`` (5% by default: a named target at the
    largest measured size is not flagged for rounding).
    """
    run_sizes = np.asarray(run_sizes, np.float64)
    over_runs = m_target / run_sizes.max()
    over_measured = m_target / np.max(target_sizes) if target_sizes is not None and len(target_sizes) else np.nan
    drafts = _outside(n_star, np.min(draft_sizes), np.max(draft_sizes)) if draft_sizes is not None and len(
        draft_sizes) else np.nan
    runs = _outside(n_star, run_sizes.min(), run_sizes.max())
    flags = []
    if over_runs > tolerance:
        flags.append(f"M {over_runs:.3g}x largest run")
    if np.isfinite(over_measured) and over_measured > tolerance:
        flags.append(f"M {over_measured:.3g}x largest measured target")
    if np.isfinite(drafts) and drafts > tolerance:
        flags.append(f"N* {drafts:.3g}x outside measured drafts")
    if np.isfinite(runs) and runs > tolerance:
        flags.append(f"N* {runs:.3g}x outside runs")
    return Extrapolation(float(over_runs), float(over_measured), float(drafts), float(runs), tuple(flags))


@dataclasses.dataclass(frozen=True)
class PerplexityScale:
    """The law's perplexity at the acceptance rows' (N, D) against the measured perplexity.

    Attributes:
      ratio: median over the measured models of law perplexity / measured perplexity.
      low, high: the smallest and largest ratio.
      models: models compared (drafts and targets with their own N and D).
      consistent: the median ratio within ``[1 / limit, limit]``.
      message: what an inconsistency means, or an empty string.
    """

    ratio: float
    low: float
    high: float
    models: int
    consistent: bool
    message: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def perplexity_scale(law, acceptance, *, limit: float = 1.25) -> PerplexityScale:
    """Check that the loss law and the acceptance CSV speak of the same perplexities.

    N* feeds the acceptance model the LAW's perplexities exp(L(N, D)), while the acceptance model
    was fitted on the MEASURED ones. If the two are on different texts or tokenizers (a Chinchilla
    law gives OPT-125M a perplexity near 15; it measures 27.65 on WikiText-2), the acceptance model
    is evaluated off its data and N* is biased.
    """
    n = np.concatenate([acceptance.n_draft, acceptance.n_target])
    d = np.concatenate([acceptance.d_draft, acceptance.d_target])
    measured = np.concatenate([acceptance.ppl_draft, acceptance.ppl_target])
    _, keep = np.unique(np.stack([n, d, measured]), axis=1, return_index=True)
    law_ppl = np.exp(np.asarray(law.loss(n[keep], d[keep]), np.float64))
    ratios = law_ppl / measured[keep]
    ratio = float(np.median(ratios))
    consistent = 1 / limit <= ratio <= limit
    message = "" if consistent else (
        f"the loss law's perplexity at the acceptance rows' (N, D) is {ratio:.2f}x the measured one (median over "
        f"{keep.size} models, {ratios.min():.2f}-{ratios.max():.2f}): the acceptance perplexities were measured on "
        "another text or tokenizer than the pre-training losses. The acceptance model is fitted on the measured "
        "perplexities but N* feeds it the law's, so N* is biased; measure both on one text")
    return PerplexityScale(ratio, float(ratios.min()), float(ratios.max()), int(keep.size), bool(consistent), message)


def unlabelled_repeats(runs) -> tuple[int, int] | None:
    """The first two rows (0-based) of one size and one budget that carry no ``run`` label, or None.

    A blank ``run`` groups a size's rows into one training run (checkpoints or branches of one
    schedule); two rows at the same budget cannot be one run, and grouping them would merge two
    runs into one random effect.
    """
    seen = {}
    for i, (label, n, d) in enumerate(zip(runs.run, runs.n_params, runs.n_tokens)):
        if label is None:
            key = (float(n), float(d))
            if key in seen:
                return seen[key], i
            seen[key] = i
    return None


def format_assumptions(record: dict) -> list[str]:
    """The ``Assumptions:`` block of a run's record (``summary.json``'s ``assumptions``), line by line."""
    def fmt(v):
        return ", ".join(f"{x:.3g}" for x in v) if isinstance(v, list) else ("-" if v is None else f"{v:.3g}")

    data = record["data"]
    lines = ["Assumptions:",
             f"  data: {data['pretraining']['path']} (sha256 {data['pretraining']['sha256'][:12]})"
             + (f"; {data['acceptance']['path']} (sha256 {data['acceptance']['sha256'][:12]})"
                if data["acceptance"] else "")]
    for key, name in (("d_draft", "draft budget D"), ("d_target", "target budget D'"), ("targets", "targets M"),
                      ("m_range", "N*(M) grid")):
        lines.append(f"  {name}: {fmt(record[key]['value'])} ({record[key]['source']})")
    lines.append(f"  recipe {record['recipe']}; cost {record['cost']}; loss law {record['law']}; acceptance: "
                 f"{record['acceptance_model']}")
    if record["runs"] != "as labelled":
        lines.append(f"  runs: {record['runs']}")
    return lines
