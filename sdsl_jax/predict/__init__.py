"""From fitted links to predictions: predictive draws, N* with bands, candidate drafts ranked.

==========  ==========================================================================================
draws       posterior draws paired across the two posteriors, and the one implementation of
            posterior-predictive draws (a new run's or model's residuals, or the known effects of
            the runs and models in the data)
propagate   N*(M), gamma*, T* solved for every draw (:func:`solve_draws`), summarised as bands;
            the implicit sensitivity of N* to a fixed plane
ranking     N* at the point fit and with bands (:func:`predict_draft_size`); each candidate draft's
            alpha and T, the predicted best and P(best) (:func:`rank_drafts`)
==========  ==========================================================================================
"""

from sdsl_jax.predict import draws, propagate, ranking
from sdsl_jax.predict.draws import *  # noqa: F401,F403
from sdsl_jax.predict.propagate import *  # noqa: F401,F403
from sdsl_jax.predict.ranking import *  # noqa: F401,F403

__all__ = [*draws.__all__, *propagate.__all__, *ranking.__all__]
