"""sdsl-jax: Speculative Decoding Scaling Laws (SDSL, arXiv 2603.11053) in differentiable JAX.

The chain the paper is about, each link one module with one protocol:

    loss law L(N, D)        sdsl_jax.loss_laws   (families: chinchilla, kaplan, broken, data)
    -> acceptance alpha     sdsl_jax.acceptance  (plane on perplexities, plane on losses)
    -> cost of an iteration sdsl_jax.costs       (SDSL FLOPs, all-positions FLOPs, latencies)
    -> gamma*, T*           sdsl_jax.speculative, sdsl_jax.costs.best_lookahead
    -> N*                   sdsl_jax.optimum     (for any draft recipe, sdsl_jax.recipes)

composed by :mod:`sdsl_jax.objective` and solved by :func:`solve_draft_size`; fitted (point fits
and NumPyro posteriors) by :mod:`sdsl_jax.infer`, turned into predictions by
:mod:`sdsl_jax.predict`, forms compared by :mod:`sdsl_jax.compare`, and run end to end by
:mod:`sdsl_jax.pipeline`. The public API is re-exported here; the NumPyro side of
``sdsl_jax.infer``, the predictions, the pipeline and the Flax model and decoding engine
(``sdsl_jax.lm.model``, ``sdsl_jax.lm.decoding``) are imported on demand, as submodules, to keep this
import light.
"""

from sdsl_jax.assumptions import (
    AnalysisSettings,
    Extrapolation,
    PerplexityScale,
    Setting,
    SettingsError,
    extrapolation,
    perplexity_scale,
    settings_from_data,
)
from sdsl_jax.store import WriteError, atomic_write, content_digest
from sdsl_jax.acceptance import (
    ACCEPTANCE_MODELS,
    LOG_PLANE,
    LOGIT_PLANE,
    PLANE,
    SDSL2026,
    AcceptanceModel,
    AcceptancePlane,
    ResidualAcceptance,
    LogPerplexityPlane,
    LogitPlane,
    acceptance_from_counts,
    acceptance_from_distributions,
    acceptance_rate,
    predictive_acceptance,
)
from sdsl_jax.normal import log_ndtri, truncated_normal_quantile
from sdsl_jax.costs import (
    COST_MODELS,
    target_alone_cost,
    SDSL_FLOPS,
    AllPositionsFlops,
    LatencyCost,
    SDSLFlops,
    best_lookahead,
    iteration_cost_under,
    target_alone_throughput,
    throughput_under,
)
from sdsl_jax.data import DataError, load_acceptance, load_pretraining, save_acceptance, save_pretraining
from sdsl_jax.infer.point import (IdentifiabilityError, check_acceptance_data, check_loss_law_data, fit_acceptance_plane,
                              fit_loss_law, fit_multistart)
from sdsl_jax.lambertw import lambertw, lambertw_m1_log
from sdsl_jax.loss_laws import (
    BESIROGLU2024,
    BROKEN_POWER_LAW,
    CHINCHILLA,
    DATA_ONLY,
    EPOCH_GRID,
    FAMILIES,
    HOFFMANN2022,
    KAPLAN,
    KAPLAN2020,
    BrokenPowerLaw,
    DataLaw,
    KaplanLaw,
    LossLaw,
    DataCentre,
    LossLawFamily,
    family_of,
    perplexity,
    pretraining_loss,
)
from sdsl_jax.objective import draft_acceptance, draft_throughput
from sdsl_jax.optimum import (
    DraftSizeGradient,
    DraftSizeSolution,
    SDSL2026_LINEAR_LAW,
    LinearLaw,
    SolveStatus,
    draft_size_gradient,
    fit_linear_law,
    optimal_draft_size,
    solve_draft_size,
    status_message,
)
from sdsl_jax.protocols import AcceptanceRateModel, DraftRecipe, IterationCostModel, LossLawModel
from sdsl_jax.recipes import FixedCompute, FixedTokens, TokensPerParameter
from sdsl_jax.speculative import (
    acceptance_from_mean_length,
    acceptance_from_position_counts,
    expected_tokens,
    iteration_cost,
    operations_factor,
    optimal_integer_lookahead,
    optimal_lookahead,
    optimal_throughput,
    speedup,
    throughput,
)

__version__ = "0.1.0"

__all__ = [
    "AnalysisSettings",
    "Extrapolation",
    "PerplexityScale",
    "Setting",
    "SettingsError",
    "extrapolation",
    "perplexity_scale",
    "settings_from_data",
    "WriteError",
    "atomic_write",
    "content_digest",
    "ACCEPTANCE_MODELS",
    "AcceptanceModel",
    "AcceptancePlane",
    "ResidualAcceptance",
    "AllPositionsFlops",
    "BESIROGLU2024",
    "BROKEN_POWER_LAW",
    "BrokenPowerLaw",
    "CHINCHILLA",
    "COST_MODELS",
    "DATA_ONLY",
    "DataError",
    "DataLaw",
    "DraftSizeGradient",
    "DraftSizeSolution",
    "EPOCH_GRID",
    "FAMILIES",
    "FixedCompute",
    "LossLawModel",
    "AcceptanceRateModel",
    "IterationCostModel",
    "DraftRecipe",
    "FixedTokens",
    "HOFFMANN2022",
    "IdentifiabilityError",
    "KAPLAN",
    "KAPLAN2020",
    "KaplanLaw",
    "LOG_PLANE",
    "LOGIT_PLANE",
    "LatencyCost",
    "LinearLaw",
    "LogPerplexityPlane",
    "LogitPlane",
    "LossLaw",
    "DataCentre",
    "LossLawFamily",
    "PLANE",
    "SDSL2026",
    "SDSL2026_LINEAR_LAW",
    "SDSLFlops",
    "SDSL_FLOPS",
    "SolveStatus",
    "TokensPerParameter",
    "acceptance_from_counts",
    "acceptance_from_distributions",
    "acceptance_from_mean_length",
    "acceptance_from_position_counts",
    "acceptance_rate",
    "best_lookahead",
    "check_acceptance_data",
    "check_loss_law_data",
    "draft_acceptance",
    "draft_size_gradient",
    "draft_throughput",
    "expected_tokens",
    "family_of",
    "fit_acceptance_plane",
    "fit_linear_law",
    "fit_loss_law",
    "fit_multistart",
    "iteration_cost",
    "iteration_cost_under",
    "lambertw",
    "lambertw_m1_log",
    "log_ndtri",
    "load_acceptance",
    "load_pretraining",
    "operations_factor",
    "optimal_draft_size",
    "optimal_integer_lookahead",
    "optimal_lookahead",
    "optimal_throughput",
    "perplexity",
    "predictive_acceptance",
    "pretraining_loss",
    "save_acceptance",
    "save_pretraining",
    "solve_draft_size",
    "speedup",
    "status_message",
    "target_alone_cost",
    "target_alone_throughput",
    "throughput",
    "throughput_under",
    "truncated_normal_quantile",
]
