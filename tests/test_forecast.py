"""The Bayes decision, the baselines and the forecast scores, against brute force."""

import numpy as np
import pytest

from sdsl_jax.forecast import baseline_forecasts, bayes_decision, forecast_scores


def test_bayes_decision_maximises_expected_throughput_not_the_probability_of_winning():
    # Candidate 0 wins 60% of the draws by a hair; candidate 1 wins 40% by a lot: E[T] prefers 1.
    t = np.array([[1.01, 1.0]] * 6 + [[1.0, 2.0]] * 4)
    decision = bayes_decision(t)
    np.testing.assert_allclose(decision.p_best, [0.6, 0.4])
    assert decision.choice == 1
    np.testing.assert_allclose(decision.expected_throughput, t.mean(axis=0))
    # Regret of choosing 1: 6 draws lose 0.01/1.01, 4 lose nothing.
    assert decision.expected_regret == pytest.approx(6 * (1 - 1.0 / 1.01) / 10)


def test_an_inadmissible_candidate_counts_as_no_throughput_and_cannot_win():
    t = np.array([[np.nan, 1.0], [np.nan, 1.0], [3.0, 1.0]])
    decision = bayes_decision(t)
    np.testing.assert_allclose(decision.expected_throughput, [1.0, 1.0])
    np.testing.assert_allclose(decision.p_best, [1 / 3, 2 / 3])
    with pytest.raises(ValueError, match="draws, candidates"):
        bayes_decision(np.ones(3))


def test_baselines_follow_their_rules():
    n = np.array([4e4, 1e5, 2e5, 5e5])
    first = {f.name: f.p_best for f in baseline_forecasts(n, 1e6)}
    np.testing.assert_allclose(first["uniform"], 0.25)
    np.testing.assert_allclose(first["smallest"], [1, 0, 0, 0])
    np.testing.assert_allclose(first["previous-best"], 0.25)  # no previous target: uniform
    np.testing.assert_allclose(first["fixed-ratio"], 0.25)
    later = {f.name: f.p_best for f in baseline_forecasts(n, 2e6, previous_best=1e5, earlier=[(1e6, 1e5), (4e5, 4e4)])}
    np.testing.assert_allclose(later["previous-best"], [0, 0.5, 0.5, 0])
    np.testing.assert_allclose(later["fixed-ratio"], [0, 0, 1, 0])  # M / 10 = 2e5
    top = {f.name: f.p_best for f in baseline_forecasts(n, 2e6, previous_best=5e5)}
    np.testing.assert_allclose(top["previous-best"], [0, 0, 0, 1])  # no size up: all on the largest
    for forecasts in (first, later, top):
        for p in forecasts.values():
            assert p.sum() == pytest.approx(1.0)


def test_scores_against_the_measured_best():
    score = forecast_scores([0.5, 0.3, 0.2], [1.0, 2.0, 1.5])
    assert score.log_score == pytest.approx(np.log(0.3))
    assert score.brier == pytest.approx(0.25 + 0.49 + 0.04)
    assert score.regret == pytest.approx(0.5)  # acting on candidate 0: half the best T
    assert forecast_scores([1.0, 0.0], [1.0, 2.0]).log_score == -np.inf
    with pytest.raises(ValueError, match="one value per candidate"):
        forecast_scores([0.5, 0.5], [1.0])


def test_preregistration_refuses_data_that_hold_a_held_back_model(tmp_path, capsys):
    from experiments import preregister
    from sdsl_jax.lm import ladder as rungs

    h2 = next(r for r in rungs.PRESETS["factorial"].rungs if r.name == "H2")
    n = rungs.rung_n_params(h2, rungs.PRESETS["factorial"])
    (tmp_path / "pretraining.csv").write_text("n_params,n_tokens,loss\n"
                                              + "".join(f"{v},{d},{2.0 + 1e5 / v}\n" for v in (3e4, n, 1e5)
                                                        for d in (1e6, 2e6)))
    (tmp_path / "acceptance.csv").write_text(
        "draft,target,n_draft,n_target,d_draft,d_target,ppl_draft,ppl_target,alpha\n"
        + "".join(f"d{i},t{i},3e4,1e5,1e6,1e6,{9 + i},{6 + i / 3},{0.5 + i / 50}\n" for i in range(5)))
    code = preregister.main(["--data", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "held-back model(s) ['H2']" in err and not (tmp_path / "out").exists()


def _registered():
    import json
    import os

    root = os.path.join(os.path.dirname(__file__), os.pardir, "fits", "ladder")
    with open(os.path.join(root, "preregistered", "predictions.json")) as f:
        return json.load(f), os.path.join(root, "acceptance.csv")


def test_the_registered_prediction_is_scored_as_it_stands(tmp_path):
    """Score the committed prediction against the factorial data plus invented held-back pairs: one at
    each band's median alpha (inside), one far above (outside). Every score is recomputed here by hand."""
    import csv

    from sdsl_jax import SDSL_FLOPS, best_lookahead, load_acceptance
    from sdsl_jax.validation import preregistered

    predictions, data = _registered()
    held = {h["name"] for h in predictions["held_back"]}
    with open(data, newline="") as f:  # the measured held-back pairs, once committed, are replaced by invented ones
        rows = [r for r in csv.DictReader(f) if not {r["draft"].split("@")[0], r["target"].split("@")[0]} & held]
    top = predictions["data"]["top_budget_tokens"]
    steps = {name: round(tokens / (2048 if tokens == 10000384.0 else 4096)) for name, tokens in top.items()}
    added = {}
    for t in predictions["targets"]:
        for c in t["candidates"]:
            if not (t["held_back_target"] or c["held_back"]):
                continue
            alpha = 0.999 if (c["name"], t["target"]) == ("L1", "H8") else c["alpha_90"][1]
            added[c["name"], t["target"]] = alpha
            rows.append(dict(rows[0], draft=f"{c['name']}@{steps[c['name']]}", target=f"{t['target']}@{steps[t['target']]}",
                             n_draft=c["n_params"], n_target=t["m_target"], d_draft=c["d_tokens"], d_target=t["d_target"],
                             alpha=alpha))
    path = tmp_path / "acceptance.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = preregistered.score(predictions, load_acceptance(str(path)))
    assert result["unmeasured"] == []
    by_target = {r["target"]: r for r in result["targets"]}
    h8 = by_target["H8"]
    pred = next(t for t in predictions["targets"] if t["target"] == "H8")
    t_measured = [float(best_lookahead(SDSL_FLOPS, added[c["name"], "H8"], c["n_params"], pred["m_target"]).throughput)
                  for c in pred["candidates"]]
    best = int(np.argmax(t_measured))
    assert h8["measured_best"] == pred["candidates"][best]["name"] == "L1"  # alpha 0.999 on the smallest draft
    assert h8["scores"]["method"]["log_score"] == pytest.approx(np.log(pred["candidates"][best]["p_best"]))
    assert h8["scores"]["uniform"]["log_score"] == pytest.approx(-np.log(len(t_measured)))
    chosen = [c["name"] for c in pred["candidates"]].index(pred["bayes_decision"]["draft"])
    assert h8["bayes_decision_regret"] == pytest.approx(1 - t_measured[chosen] / t_measured[best])
    pair = {p["draft"]: p for p in h8["pairs"]}
    assert pair["L1"]["alpha_in_90"] is False and pair["H2"]["alpha_in_90"] is True and pair["H2"]["new"]
    # Only targets with a held-back model are the test; L2 (one candidate, L1) is in-sample.
    summary = result["summary"]
    assert "H8" in summary["held_back_forecasts"]["targets"] and "L2" in summary["in_sample_forecasts"]["targets"]
    new_alpha = summary["held_back_pairs"]["alpha_coverage_90"]
    assert new_alpha["pairs"] == len(added) and new_alpha["inside"] == len(added) - 1
    text = preregistered.score_markdown(dict(
        command="test", commit="c", date="d", data=dict(acceptance=str(path), acceptance_sha256="0" * 64),
        predictions="p", predictions_sha256="0" * 64, registered_commit=predictions["commit"], **result))
    assert "(outside)" in text


def test_scoring_refuses_data_without_the_held_back_models(tmp_path, capsys):
    from experiments import preregister

    predictions, data = _registered()
    out = tmp_path / "prereg"
    out.mkdir()
    (out / "predictions.json").write_text(__import__("json").dumps(predictions))
    held = tuple(f"{h['name']}@" for h in predictions["held_back"])
    with open(data) as f:  # the factorial data as registered: no row of a held-back model
        lines = [line for line in f if not any(f",{h}" in line or line.startswith(h) for h in held)]
    (tmp_path / "acceptance.csv").write_text("".join(lines))
    code = preregister.main(["--score", "--data", str(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "held-back model(s) ['H2', 'H8']" in err and not (out / "score.json").exists()


def test_the_elasticity_study_groups_the_shared_budgets_and_finds_each_best_draft_by_brute_force():
    import os

    from experiments.elasticity import measured_best_by_budget, shared_budgets
    from sdsl_jax import load_acceptance, load_pretraining

    root = os.path.join(os.path.dirname(__file__), os.pardir, "fits", "ladder")
    runs = load_pretraining(os.path.join(root, "pretraining.csv"))
    budgets = shared_budgets(runs.n_tokens)
    # Five budgets, each shared by every size up to one step (2,048 or 4,096 tokens).
    assert budgets.size == 5 and np.allclose(budgets / budgets[0], [1, 2, 4, 8, 16], rtol=0.01)
    pairs = load_acceptance(os.path.join(root, "acceptance.csv"))
    best = measured_best_by_budget(pairs, budgets)
    gamma = np.linspace(0.01, 60, 60001)  # T(gamma) = E[tokens] / (2 N gamma + 2 M), brute force over gamma
    for (target, k), got in best.items():
        rows = [i for i in range(len(pairs.alpha)) if pairs.target[i].split("@")[0] == target
                and np.argmin(np.abs(np.log(budgets) - np.log(pairs.d_draft[i]))) == k
                and np.argmin(np.abs(np.log(budgets) - np.log(pairs.d_target[i]))) == budgets.size - 1]
        a = np.array([pairs.alpha[i] for i in rows])[:, None]
        n = np.array([pairs.n_draft[i] for i in rows])[:, None]
        t = ((1 - a ** (gamma + 1)) / (1 - a) / (2 * n * gamma + 2 * pairs.n_target[rows[0]])).max(axis=1)
        assert got["candidates"] == len(rows)
        assert got["draft"] == pairs.draft[rows[int(np.argmax(t))]].split("@")[0]
        assert got["tokens_per_flop"] == pytest.approx(t.max(), rel=1e-6)
