"""The committed simulation-based calibration and what the docs say of it: a guard on ``fits/calibration``.

Each shipped study's summary (``sbc-<family>.json``, ``sbc-acceptance-<model>.json``, written from its
stage lines) is quoted by one row of the results table of ``docs/results/calibration.md``: its p
values, its number of datasets, its failing posteriors and the target acceptance it was sampled at.
A study fitted again with its row left from the earlier one fails here. Its ranks are the committed
stage lines of one study key, and ``sbc.json`` gathers the same studies.
"""

import collections
import glob
import json
import os

import pytest

from sdsl_jax.acceptance import ACCEPTANCE_MODELS
from sdsl_jax.loss_laws import FAMILIES

FOLDER = "fits/calibration"
DOC = "docs/results/calibration.md"
CHECKS = ("R-hat", "bulk ESS", "divergent", "maximum tree depth")
SHIPPED = set(FAMILIES) | set(ACCEPTANCE_MODELS)  # every shipped form has its study


def study_summaries() -> list[tuple[str, dict, str]]:
    """(name, summary, the stem of its file and stage lines) of every study with a summary file of its own."""
    found = []
    for path in sorted(glob.glob(os.path.join(FOLDER, "sbc-*.json"))):
        study = json.load(open(path))["studies"]["sbc"]
        stem = os.path.basename(path)[:-len(".json")]
        found += [(name, summary, stem) for group in ("families", "acceptance_models")
                  for name, summary in study.get(group, {}).items()]
    return found


def table_rows() -> list[str]:
    section = open(DOC).read().split("## Results", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| model")]


def test_every_shipped_study_has_a_summary_of_its_own():
    assert sorted(name for name, _, _ in STUDIES) == sorted(SHIPPED)


STUDIES = study_summaries()


@pytest.mark.parametrize("name, summary, stem", STUDIES, ids=[name for name, _, _ in STUDIES])
def test_each_study_is_one_row_of_the_results_table(name, summary, stem):
    p_values = ", ".join(f"{site} {test['p_value']:.3f}" for site, test in summary["tests"].items())
    rows = [row for row in table_rows() if p_values in row]
    assert len(rows) == 1, f"{name}: no single row of {DOC}'s results quotes the p values {p_values}"
    label, datasets, _, below, failing = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert datasets == str(len(summary["ranks"]))  # one rank vector per dataset
    assert (below == "none") == (min(t["p_value"] for t in summary["tests"].values()) >= 0.01)
    assert failing == " / ".join(str(n) for n in [summary["datasets_failing_checks"]]
                                 + [summary["failing_by_check"].get(check, 0) for check in CHECKS])
    if summary.get("target_accept") is not None:
        assert f"target acceptance {summary['target_accept']:g}" in label


def test_the_gathered_file_is_the_shipped_studies():
    """``sbc.json`` (and its figure, ``sbc.png``) is gathered from the same lines as each study's own
    summary: the same ranks and tests, under the same target acceptance."""
    gathered = json.load(open(os.path.join(FOLDER, "sbc.json")))["studies"]["sbc"]
    studies = {name: summary for group in ("families", "acceptance_models")
               for name, summary in gathered.get(group, {}).items()}
    assert sorted(studies) == sorted(SHIPPED)
    for name, own, _ in STUDIES:
        for field in ("ranks", "tests", "target_accept", "datasets_failing_checks", "failing_by_check"):
            assert studies[name].get(field) == own.get(field), \
                f"sbc.json's {name} study differs from its own summary in {field}"


@pytest.mark.parametrize("name, summary, stem", STUDIES, ids=[name for name, _, _ in STUDIES])
def test_each_study_is_its_committed_stage_lines(name, summary, stem):
    """A summary's ranks are the committed lines of one study key, fitted at the target acceptance the
    summary records: the study can be gathered again, or resumed, from the repository alone."""
    by_key = collections.defaultdict(dict)
    for path in glob.glob(os.path.join(FOLDER, "stages", f"{stem}*.jsonl")):
        for line in open(path):
            unit = json.loads(line)
            by_key[json.dumps(unit["study"], sort_keys=True)][unit["dataset"]] = unit["ranks"]
    keys = [key for key, ranks in by_key.items()
            if [ranks.get(i) for i in range(len(summary["ranks"]))] == summary["ranks"]]
    assert len(keys) == 1, f"{name}: {len(keys)} study keys in {FOLDER}/stages give its summary's ranks"
    assert json.loads(keys[0]).get("target_accept") == summary.get("target_accept")
