"""A run on a user's own data answers on that data's terms (experiments.fit with --pretraining /
--acceptance): its settings or a refusal naming the flag, assumptions stated, extrapolation flagged,
perplexity scales checked, the answer printed with --quiet too."""

import json
import os

import numpy as np
import pytest

from experiments import fit
from sdsl_jax import BESIROGLU2024, SDSL2026

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
RUNS = os.path.join(ROOT, "fits", "data", "chinchilla_fig4.csv")
FAST = ["--starts", "100", "--no-figures", "--quiet"]


def pairs_csv(path, *, d_draft=1e11, d_target=2e12, ppl_scale=1.0, vary_d_target=False):
    """Acceptance pairs whose perplexities follow the Chinchilla law at their own (N, D)."""
    rng = np.random.default_rng(0)
    rows = ["draft,target,n_draft,n_target,d_draft,d_target,ppl_draft,ppl_target,alpha"]
    for i, (n, m) in enumerate([(n, m) for m in (7e9, 1.3e10) for n in (6e7, 1.25e8, 3.5e8, 7e8)]):
        dt = d_target * (1 + i) if vary_d_target else d_target
        x = float(np.exp(BESIROGLU2024.loss(n, d_draft))) * ppl_scale
        y = float(np.exp(BESIROGLU2024.loss(m, dt))) * ppl_scale
        alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.01)
        rows.append(f"d{n:.0f},t{m:.0f},{n!r},{m!r},{d_draft!r},{dt!r},{x!r},{y!r},{alpha!r}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_user_data_supply_the_budgets_and_targets_and_the_output_says_so(tmp_path, capsys):
    pairs = pairs_csv(tmp_path / "pairs.csv")
    out = tmp_path / "out"
    assert fit.main([*FAST, "--pretraining", RUNS, "--acceptance", pairs, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    a = _summary(out)["assumptions"]
    assert a["d_draft"] == {"value": 1e11, "source": f"{pairs} (column d_draft, every row)"}
    assert a["d_target"]["value"] == 2e12 and "column d_target" in a["d_target"]["source"]
    assert a["targets"]["value"] == [7e9, 1.3e10] and "measured targets" in a["targets"]["source"]
    assert a["dataset"] == "your data" and a["data"]["acceptance"]["path"] == pairs
    assert _summary(out)["settings"]["d_target"] == 2e12  # not the Chinchilla dataset's 1e12
    # The printed answer opens with the assumptions and --quiet keeps it.
    assert printed.lstrip().startswith("Assumptions:") and "target budget D': 2e+12" in printed
    assert "target M" in printed


@pytest.mark.parametrize("args, fragment", [
    ([], "give --d-draft: the draft's training budget D is not in pre-training runs"),
    (["--d-draft", "1e11"], "give --d-target"),
    (["--d-draft", "1e11", "--d-target", "1e12"], "give --targets"),
])
def test_pretraining_runs_alone_need_the_settings_given(args, fragment, tmp_path, capsys):
    out = tmp_path / "out"
    assert fit.main([*FAST, "--pretraining", RUNS, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and not out.exists()


def test_pairs_with_several_target_budgets_need_the_flag(tmp_path, capsys):
    pairs = pairs_csv(tmp_path / "pairs.csv", vary_d_target=True)
    assert fit.main([*FAST, "--pretraining", RUNS, "--acceptance", pairs, "--out", str(tmp_path / "out")]) == 2
    assert "give --d-target: " in capsys.readouterr().err
    assert fit.main([*FAST, "--pretraining", RUNS, "--acceptance", pairs, "--d-target", "3e12",
                     "--out", str(tmp_path / "out")]) == 0
    assert _summary(tmp_path / "out")["assumptions"]["d_target"] == {"value": 3e12, "source": "--d-target"}


def test_targets_beyond_the_data_are_flagged_in_the_table_and_summary(tmp_path, capsys):
    pairs = pairs_csv(tmp_path / "pairs.csv")
    out = tmp_path / "out"
    assert fit.main([*FAST, "--pretraining", RUNS, "--acceptance", pairs, "--out", str(out),
                     "--targets", "7e9", "1e12"]) == 0
    captured = capsys.readouterr()
    near, far = _summary(out)["targets"]
    assert near["beyond_data"]["flags"] == []
    assert far["beyond_data"]["target_over_runs"] == pytest.approx(1e12 / 16.183e9, rel=1e-3)
    assert "M 61.8x largest run" in far["beyond_data"]["flags"]
    assert far["beyond_data"]["target_over_measured"] == pytest.approx(1e12 / 1.3e10)
    assert "M 61.8x largest run" in captured.out and "lie beyond the data" in captured.err


def test_perplexities_on_another_scale_than_the_law_are_warned_about(tmp_path, capsys):
    consistent = pairs_csv(tmp_path / "same.csv")
    other = pairs_csv(tmp_path / "other.csv", ppl_scale=1.8)  # another text or tokenizer
    ratios = []
    for pairs, warned in ((consistent, False), (other, True)):
        out = tmp_path / ("out-" + os.path.basename(pairs))
        assert fit.main([*FAST, "--pretraining", RUNS, "--acceptance", pairs, "--out", str(out)]) == 0
        scale = _summary(out)["perplexity_scale"]
        assert scale["consistent"] is (not warned)
        err = capsys.readouterr().err
        assert ("measured on another text or tokenizer" in err) is warned
        ratios.append(scale["ratio"])
    assert ratios[1] / ratios[0] == pytest.approx(1 / 1.8, rel=1e-6)  # the same law against perplexities x1.8


def test_two_unlabelled_rows_at_one_size_and_budget_are_not_merged_into_one_run(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    rows = [f"{n!r},{d!r},{float(BESIROGLU2024.loss(n, d))!r}" for n in (1e8, 3e8, 1e9, 3e9)
            for d in (2e9, 2e10, 2e11)]
    runs.write_text("n_params,n_tokens,loss\n" + "\n".join(rows + [rows[4]]) + "\n")  # row 5 measured twice
    args = [*FAST, "--pretraining", str(runs), "--d-draft", "1e11", "--d-target", "1e12", "--targets", "7e9",
            "--out", str(tmp_path / "out")]
    assert fit.main(args) == 2
    err = capsys.readouterr().err
    assert "column 'run'" in err and "rows 5 and 13" in err
    assert fit.main([*args, "--run-effects", "off"]) == 0  # rows independent: nothing is merged


@pytest.mark.slow
def test_a_sampler_runs_again_on_data_of_another_shape():
    """Cross-validation in a notebook: the compiled sampler is reused per shape, not across shapes.

    Five chains on four devices run vectorised, the case whose cached state failed on new shapes
    (two vectorised compilations; the cache's keying on shapes is checked fast by
    `test_bayes.py::test_a_cached_sampler_is_keyed_on_the_data_shapes`)."""
    from sdsl_jax import infer

    rng = np.random.default_rng(0)
    for rows in (20, 31):
        x, y = rng.uniform(8, 40, rows), rng.uniform(4, 12, rows)
        a = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.02, rows)
        run = infer.sample_plane(x, y, a, num_chains=5, num_warmup=5, num_samples=10, progress_bar=False,
                                 summarize=False)
        assert run.samples["A"].shape == (50,) and np.all(np.isfinite(run.samples["A"]))


def test_per_model_effects_default_on_only_where_the_design_identifies_them():
    from sdsl_jax.data import load_acceptance

    ladder = load_acceptance(os.path.join(ROOT, "fits", "ladder-v1", "acceptance.csv"))
    sides, why = ladder.model_effects_identified()
    # 20 drafts give their effects a scale; six targets leave four contrasts beyond the intercept
    # and the slope, too few: the targets' effects are left out, and the reason says so.
    assert sides == ("draft",) and "20 draft models in two or more pairs" in why
    assert "only 6 target model(s) appear in two or more pairs, 4 beyond" in why
    assert ladder.model_effects_identified(min_contrasts=4)[0] == ("draft", "target")
    # Published-style pairs: 4 targets with up to 6 drafts each: neither kind has enough models;
    # the default keeps the pairs independent and says why.
    keep = np.isin(ladder.target, sorted(set(ladder.target))[:4]) & np.isin(ladder.draft, sorted(set(ladder.draft))[:6])
    small = ladder.select(keep)
    sides, why = small.model_effects_identified()
    assert small.has_repeated_models() and not sides
    assert "target model(s) appear in two or more pairs" in why
