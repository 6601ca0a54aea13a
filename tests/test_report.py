"""What a fit reports: the advice for a failed posterior, the table read back from summary.json."""

import json
import os

from sdsl_jax import report
from sdsl_jax.figures import format_size

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_failed_posterior_advice_names_what_is_not_identified():
    from types import SimpleNamespace

    post = SimpleNamespace(identification=SimpleNamespace(
        flags=("A and alpha: identified only together (posterior correlation +0.998)",)))
    advice = report.diagnostics_advice("loss_law", post)
    assert "A and alpha: identified only together" in advice and "Longer chains will not fix this" in advice
    # Without unidentified parameters the advice is to sample longer.
    assert "Run longer" in report.diagnostics_advice("loss_law", SimpleNamespace(identification=SimpleNamespace(flags=())))


def test_failed_posterior_advice_names_the_tree_depth_cap_of_the_run_that_hit_it():
    """The advice reads the failed run's own tree-depth share (it once read an attribute the
    checks do not have, so that a posterior stuck at the cap was told to run longer)."""
    from types import SimpleNamespace

    from sdsl_jax.infer import Diagnostics, PosteriorChecks

    capped = Diagnostics(1.002, 900.0, 0, False, ("30% of draws at the maximum tree depth",), 800.0, 0.3)
    fine = capped._replace(ok=True, problems=(), mean_steps=15.0, max_tree_depth_share=0.0)
    post = SimpleNamespace(identification=SimpleNamespace(flags=()), diagnostics=PosteriorChecks(capped, fine))
    assert "maximum tree depth" in report.diagnostics_advice("loss_law", post)
    calm = SimpleNamespace(identification=SimpleNamespace(flags=()), diagnostics=PosteriorChecks(fine, fine))
    assert "maximum tree depth" not in report.diagnostics_advice("loss_law", calm)


def test_the_table_reads_only_the_summary():
    """The committed reference summary prints its table: every N* band and the linear law come from the
    record alone (a summary.json written earlier prints the same table)."""
    with open(os.path.join(REPO, "fits", "reference", "summary.json")) as handle:
        summary = json.load(handle)
    table = report.format_table(summary)
    for target in summary["targets"]:
        assert format_size(target["n_star_median"]) in table
    assert f"mu = {summary['linear_law']['mu']:.4g}" in table and "paper: mu = " in table
