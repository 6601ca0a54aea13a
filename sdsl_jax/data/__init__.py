"""Dataset schemas (version 1): the tables the fits read, loaded with every cell checked, saved atomically.

``sdsl-pretraining v1`` (:class:`PretrainingRuns`: N, D, loss per run), ``sdsl-acceptance v1``
(:class:`AcceptanceMeasurements`: one draft/target pair per row, alpha measured or derived from
what serving engines report), ``sdsl-speculative v1`` (:class:`SpeculativeRuns`: one (target,
draft, gamma) decoding run per row, cross-checked against itself) and ``sdsl-latency v1``
(:class:`LatencyMeasurements`: timed forward calls). Every column, its rule and its meaning are in
``docs/data.md``; the schema tuples in the submodules are what the loaders enforce.

Every problem is a :class:`DataError` that names the file, the line and the column and shows the
offending value. Saving is atomic (a temporary file renamed into place).
"""

from sdsl_jax.data import acceptance, latency, pretraining, speculative
from sdsl_jax.data.acceptance import *  # noqa: F401,F403
from sdsl_jax.data.latency import *  # noqa: F401,F403
from sdsl_jax.data.pretraining import *  # noqa: F401,F403
from sdsl_jax.data.speculative import *  # noqa: F401,F403
from sdsl_jax.data.tables import DataError

SCHEMA_VERSION = 1

__all__ = ["DataError", "SCHEMA_VERSION", *pretraining.__all__, *acceptance.__all__, *speculative.__all__,
           *latency.__all__]
