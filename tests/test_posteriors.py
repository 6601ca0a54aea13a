"""``python -m experiments.posteriors``: every posterior the results record and how NUTS sampled it;
and a guard that docs/benchmarks.md quotes what it says of the committed results."""

import json
import os

import pytest

from experiments import posteriors
from sdsl_jax.infer import Diagnostics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _record(**changes) -> dict:
    checks = Diagnostics(max_rhat=1.004, min_ess_bulk=900.0, num_divergences=0, ok=True, problems=(),
                         mean_steps=40.0, max_tree_depth_share=0.0, median_steps=63.0, attempts=1)
    return checks._replace(**changes)._asdict()


def _write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)


def test_lists_each_file_s_posteriors_and_those_outside_the_goal(tmp_path, capsys):
    fit = _record()
    _write(tmp_path / "a" / "closure.json", dict(
        stacking=dict(diagnostics=dict(chinchilla=fit)), diagnostics=dict(chinchilla=fit),
        prospective_fits={"24832": dict(diagnostics=dict(
            broken=_record(median_steps=255.0, max_tree_depth_share=0.002, attempts=2),
            kaplan=_record(ok=False, problems=["1 divergent transitions"], num_divergences=1)))}))
    _write(tmp_path / "b" / "summary.json", dict(posterior=dict(diagnostics=dict(loss_law=_record()))))
    _write(tmp_path / "b" / "figures.json", dict(rows=[1, 2]))  # no posterior: skipped
    out = tmp_path / "listing.json"
    assert posteriors.main([str(tmp_path), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{tmp_path}/a/closure.json: 3 posteriors, 2 passed the checks, 2 sampled within the goal",
        "  prospective_fits/24832/diagnostics/broken: 255 leapfrog steps per draw (median) > 64; "
        "0.2% of draws at the maximum tree depth (passed its checks, 2 runs)",
        f"{tmp_path}/b/summary.json: 1 posterior, 1 passed the checks, 1 sampled within the goal",
        "4 posteriors in 2 files: 3 passed the checks, 3 sampled within 64 leapfrog steps per draw (median), "
        "none at the maximum tree depth and bulk ESS >= 400",
    ]
    listing = json.loads(out.read_text())
    assert (listing["total"], listing["passed"], listing["within_goal"]) == (4, 3, 3)
    assert listing["files"][0]["posteriors"][0]["places"] == ["stacking/diagnostics/chinchilla",
                                                              "diagnostics/chinchilla"]
    assert listing["command"].startswith("python -m experiments.posteriors")


def test_the_goal_is_set_by_its_flags(tmp_path, capsys):
    _write(tmp_path / "summary.json", dict(diagnostics=dict(loss_law=_record(median_steps=127.0))))
    assert posteriors.main([str(tmp_path / "summary.json"), "--max-median-steps", "127"]) == 0
    assert "1 sampled within 127 leapfrog steps" in capsys.readouterr().out


@pytest.mark.parametrize("content, fragment", [
    ('{"diagnostics": {"plane": ', "bad.json:1: is not JSON"),
    (json.dumps(dict(fits=[dict(diagnostics=dict(plane=_record() | {"rhat": 1.0}))])),
     "bad.json: fits/0/diagnostics/plane: not a posterior's diagnostics: unknown fields ['rhat']"),
])
def test_a_result_that_cannot_be_read_exits_2_naming_the_file(tmp_path, capsys, content, fragment):
    (tmp_path / "bad.json").write_text(content)
    assert posteriors.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and "Traceback" not in err


def test_a_path_that_does_not_exist_exits_2(tmp_path, capsys):
    assert posteriors.main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or folder" in capsys.readouterr().err


def test_benchmarks_md_quotes_what_the_command_says_of_the_committed_results(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert posteriors.main([]) == 0
    quoted = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("  ")]
    with open(os.path.join(REPO, "docs", "benchmarks.md")) as f:
        doc = f.read()
    block = doc.split("`python -m experiments.posteriors`", 1)[1].split("```\n", 2)[1]
    assert block.splitlines() == quoted


def test_a_file_that_is_not_text_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "weights.json").write_bytes(b"\xff\xfe\x00\x01")
    assert posteriors.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "weights.json: is not JSON: not UTF-8 text" in err and "Traceback" not in err
