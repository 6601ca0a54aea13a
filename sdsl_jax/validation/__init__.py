"""Checks of the method against measured models: library functions that return records, with the
report writers (markdown, figures) kept apart from the computation.

===============  ======================================================================================
closure          for every target of measured speculative runs, the law's predicted best draft, alpha,
                 T and N* against the measured ones; the measured side's bootstrap over prompts; the
                 forecast scored (:func:`~sdsl_jax.validation.closure.close_loop`)
forms            forms fitted side by side and stacked (:func:`~sdsl_jax.validation.forms.fit_forms`),
                 one form's fit of a data set, the stacked mixture's draws
closure_fits     the closure's fits: in sample, without each draft size (prospective), of what came
                 before each target (forward), and in sample with every prior widened
closure_report   the closure's markdown table and figure
holdout          each model size held out in turn: coverage of the predictive bands, grouped
                 leave-one-size-out log densities, stacking weights over the laws
wallclock        the wall-clock closure: a latency model fitted from timed calls against measured
                 speedups, per run and per target
calibration      simulation-based calibration (rank of the truth among posterior draws) of any model's
                 fit, and of each loss-law family on a ladder's design; coverage of 90% intervals
                 and of N* bands on synthetic data
===============  ======================================================================================

The commands ``python -m experiments.closure``, ``experiments.holdout`` and ``experiments.wallclock``
run them on a ladder; ``experiments.calibration`` runs the calibration studies.
"""
