"""sdsl-jax: Speculative Decoding Scaling Laws (SDSL, arXiv 2603.11053) in differentiable JAX.

The public API is re-exported here; the implementation lives in the submodules. The NumPyro
models (``sdsl_jax.bayes``) and the Flax model and decoding engine (``sdsl_jax.model``,
``sdsl_jax.decoding``) are imported on demand, as submodules, to keep this import light.
"""

from sdsl_jax.acceptance import (
    SDSL2026,
    AcceptancePlane,
    acceptance_from_counts,
    acceptance_from_distributions,
    acceptance_rate,
)
from sdsl_jax.data import DataError, load_acceptance, load_pretraining, save_acceptance, save_pretraining
from sdsl_jax.fitting import EPOCH_GRID, fit_acceptance_plane, fit_loss_law, fit_multistart
from sdsl_jax.lambertw import lambertw, lambertw_m1_log
from sdsl_jax.optimum import (
    DraftSizeSolution,
    SDSL2026_LINEAR_LAW,
    LinearLaw,
    SolveStatus,
    draft_acceptance,
    draft_throughput,
    fit_linear_law,
    optimal_draft_size,
    solve_draft_size,
)
from sdsl_jax.scaling import BESIROGLU2024, HOFFMANN2022, LossLaw, perplexity, pretraining_loss
from sdsl_jax.speculative import (
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
    "AcceptancePlane",
    "BESIROGLU2024",
    "DataError",
    "DraftSizeSolution",
    "EPOCH_GRID",
    "HOFFMANN2022",
    "LinearLaw",
    "LossLaw",
    "SDSL2026",
    "SDSL2026_LINEAR_LAW",
    "SolveStatus",
    "acceptance_from_counts",
    "acceptance_from_distributions",
    "acceptance_rate",
    "draft_acceptance",
    "draft_throughput",
    "expected_tokens",
    "fit_acceptance_plane",
    "fit_linear_law",
    "fit_loss_law",
    "fit_multistart",
    "iteration_cost",
    "lambertw",
    "lambertw_m1_log",
    "load_acceptance",
    "load_pretraining",
    "operations_factor",
    "optimal_draft_size",
    "optimal_integer_lookahead",
    "optimal_lookahead",
    "optimal_throughput",
    "perplexity",
    "pretraining_loss",
    "save_acceptance",
    "save_pretraining",
    "solve_draft_size",
    "speedup",
    "throughput",
]
