"""What ``python -m experiments.fit`` writes besides the summary's science: the provenance records, the
diagnostics lines, the figures, and the output folder cleared of an earlier run's files."""

from __future__ import annotations

import os
import shutil

import numpy as np

from experiments.fit_inputs import Inputs
from experiments.runlog import command_line
from sdsl_jax.assumptions import format_assumptions
from sdsl_jax.loss_laws import EXPONENT_PRIOR

OUTPUTS = ("summary.json", "loss_law_posterior.nc", "plane_posterior.nc", "loss_law_fit.png", "n_star_bands.png",
           "throughput_curves.png", "acceptance_plane.png")
"""Every file a run can write in --out (besides stages/)."""


def data_record(inputs: Inputs) -> dict:
    """The files read, with the digests of the bytes parsed."""
    runs, acceptance = inputs.runs, inputs.acceptance
    return dict(pretraining=dict(path=inputs.pre_path, sha256=runs.sha256, runs_used=len(runs),
                                 dropped_highest_loss=inputs.drop),
                acceptance=dict(path=inputs.acc_path, sha256=acceptance.sha256, pairs=len(acceptance))
                if acceptance else None)


def settings_record(args, inputs: Inputs, starts: int) -> dict:
    """The run's choices; the NUTS settings only for a run that sampled."""
    return dict(dataset="your data" if inputs.user_data else inputs.dataset.name, law=inputs.family.name,
                acceptance_model=inputs.acceptance_model.name, cost=args.cost, recipe=args.recipe,
                d_draft=args.d_draft, d_target=args.d_target,
                m_grid=[float(args.m_min), float(args.m_max), args.num_targets], starts=starts,
                **(dict(chains=args.chains, warmup=args.warmup, draws=args.draws,
                        bands="mean curve only" if args.mean_only else "posterior-predictive",
                        **(dict(exponent_prior=dict(zip(("distribution", "low", "high"), EXPONENT_PRIOR)))
                           if inputs.family.uses_exponent_prior else {}))
                   if args.posterior else {}))


def latency_record(args, inputs: Inputs) -> dict | None:
    """The latency model behind --cost latency (None for a FLOP cost)."""
    fit, rows = inputs.latency_fit, inputs.latency_rows
    if fit is None:
        return None
    return dict(path=args.latency, sha256=rows.sha256, batch=args.latency_batch, form=fit.form, coef=fit.coef,
                relative_rmse=fit.relative_rmse, loop_overheads=fit.overheads,
                meaning="t(N, k) = t0 + t1 k + c1 N + c2 N k seconds per call; T* in tokens per second")


def log_diagnostics(post, log) -> bool:
    """One line per posterior run: OK with its numbers, or a banner with what failed and what to do.
    Returns whether every run passed."""
    from sdsl_jax.report import diagnostics_advice

    ok = True
    for name, diag in post.diagnostics.items():
        geometry = (f"; {diag.median_steps:.0f} leapfrog steps per draw (median; mean {diag.mean_steps:.0f}), "
                    f"{diag.max_tree_depth_share:.0%} of draws "
                    "at the maximum tree depth" if np.isfinite(diag.mean_steps) else "")
        if diag.ok:
            log(f"diagnostics ({name}): OK (max R-hat {diag.max_rhat:.3f}, min bulk ESS "
                f"{diag.min_ess_bulk:.0f}, {diag.num_divergences} divergences{geometry})")
        else:
            ok = False
            banner = "!" * 78
            log(f"{banner}\nWARNING: {name} posterior failed its diagnostics: {'; '.join(diag.problems)}.\n"
                f"Do not trust its bands. {diagnostics_advice(name, post)}\n{banner}")
    return ok


def write_figures_and_clean(args, inputs: Inputs, result, assumptions: dict, log) -> None:
    """The figures, then the folder cleared of what an earlier run with other options left."""
    post = result.posterior
    if not args.no_figures:
        from sdsl_jax import figures

        log("figures: drawing")
        with log.heartbeat(8.0):
            made = figures.fit_figures(args.out, result, runs=inputs.runs, acceptance=inputs.acceptance, d_target=args.d_target,
                                       recipe=inputs.recipe, cost=inputs.cost, compare_to_paper=inputs.dataset.compare_to_paper,
                                       predictive=not args.mean_only,
                                       caption="\n".join([command_line("experiments.fit", args.argv)]
                                                         + format_assumptions(assumptions)[2:]))
        log("figures: " + ", ".join(made))
    else:
        made = []
    # The folder holds this run's files only: drop what an earlier run with other options left.
    written = {os.path.abspath(p) for p in made} | {os.path.abspath(os.path.join(args.out, "summary.json"))}
    if post is not None:
        written |= {os.path.abspath(os.path.join(args.out, n + ".nc")) for n in ("loss_law_posterior", "plane_posterior")
                    if n == "loss_law_posterior" or post.plane_run is not None}
    if not args.stack and os.path.isdir(os.path.join(args.out, "forms")):
        shutil.rmtree(os.path.join(args.out, "forms"))  # an earlier --stack run's forms
    for name in OUTPUTS:
        path = os.path.abspath(os.path.join(args.out, name))
        if path not in written and os.path.isfile(path):
            os.remove(path)
