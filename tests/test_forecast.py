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
    from experiments import ladder, preregister

    h2 = next(r for r in ladder.PRESETS["factorial"].rungs if r.name == "H2")
    n = ladder.rung_n_params(h2, ladder.PRESETS["factorial"])
    (tmp_path / "pretraining.csv").write_text("n_params,n_tokens,loss\n"
                                              + "".join(f"{v},{d},{2.0 + 1e5 / v}\n" for v in (3e4, n, 1e5)
                                                        for d in (1e6, 2e6)))
    (tmp_path / "acceptance.csv").write_text(
        "draft,target,n_draft,n_target,d_draft,d_target,ppl_draft,ppl_target,alpha\n"
        + "".join(f"d{i},t{i},3e4,1e5,1e6,1e6,{9 + i},{6 + i / 3},{0.5 + i / 50}\n" for i in range(5)))
    code = preregister.main(["--data", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "held-back model(s) ['H2']" in err and not (tmp_path / "out").exists()
