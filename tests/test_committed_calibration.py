"""The committed simulation-based calibration and what the docs say of it: a guard on ``fits/calibration``.

Each study's summary (``sbc-<family>.json``, ``sbc-acceptance-<model>.json``, written from its stage
lines; the shipped coordinates in ``fits/calibration``, the acceptance models' data-scaled ones in
``fits/calibration/data_scaled``) is quoted by one row of its results table in
``docs/results/calibration.md``: its p values, its number of datasets, its failing posteriors and the
target acceptance it was sampled at. A study fitted again with its row left from the earlier one fails
here. Its ranks are the committed stage lines of one study key, and ``sbc.json`` gathers the shipped
studies.
"""

import collections
import functools
import glob
import json
import os

import pytest

from sdsl_jax.acceptance import ACCEPTANCE_MODELS
from sdsl_jax.loss_laws import FAMILIES
from sdsl_jax.store import read_stage_lines, stage_files

FOLDER = "fits/calibration"
DOC = "docs/results/calibration.md"
CHECKS = ("R-hat", "bulk ESS", "divergent", "maximum tree depth")
# Each folder of studies, the forms it must hold and the first cell of its table's header.
TABLES = {FOLDER: (set(FAMILIES) | set(ACCEPTANCE_MODELS), "model"),
          os.path.join(FOLDER, "data_scaled"): (set(ACCEPTANCE_MODELS), "model, data-scaled coefficients")}


def study_summaries(folder: str) -> list[tuple[str, dict, str]]:
    """(name, summary, the stem of its file and stage lines) of every study with a summary file of its own."""
    found = []
    for path in sorted(glob.glob(os.path.join(folder, "sbc-*.json"))):
        study = json.load(open(path))["studies"]["sbc"]
        stem = os.path.basename(path)[:-len(".json")]
        found += [(name, summary, stem) for group in ("families", "acceptance_models")
                  for name, summary in study.get(group, {}).items()]
    return found


@functools.cache
def table_rows(header: str) -> list[list[str]]:
    """The cells of each row of the results table whose header's first cell is ``header``."""
    section = open(DOC).read().split("## Results", 1)[1].split("\n## ", 1)[0]
    rows, current = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            current = None
        elif line.startswith("| "):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if current is None:
                current = cells[0]
            elif current == header:
                rows.append(cells)
    return rows


# (folder, name, summary, stem) of every committed study.
STUDIES = [(folder, *study) for folder in TABLES for study in study_summaries(folder)]
IDS = [f"{os.path.relpath(folder, FOLDER)}:{name}" for folder, name, _, _ in STUDIES]


@pytest.mark.parametrize("folder", TABLES)
def test_every_form_has_a_study_of_its_own(folder):
    assert sorted(name for where, name, _, _ in STUDIES if where == folder) == sorted(TABLES[folder][0])


@pytest.mark.parametrize("folder, name, summary, stem", STUDIES, ids=IDS)
def test_each_study_is_one_row_of_its_results_table(folder, name, summary, stem):
    p_values = ", ".join(f"{site} {test['p_value']:.3f}" for site, test in summary["tests"].items())
    rows = [cells for cells in table_rows(TABLES[folder][1]) if p_values in cells[2]]
    assert len(rows) == 1, \
        f"{name}: no single row of {DOC}'s table for {folder} quotes the p values {p_values}"
    label, datasets, _, below, failing = rows[0]
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
    assert sorted(studies) == sorted(TABLES[FOLDER][0])
    for _, name, own, _ in (study for study in STUDIES if study[0] == FOLDER):
        for field in ("ranks", "tests", "target_accept", "datasets_failing_checks", "failing_by_check"):
            assert studies[name].get(field) == own.get(field), \
                f"sbc.json's {name} study differs from its own summary in {field}"


@pytest.mark.parametrize("folder, name, summary, stem", STUDIES, ids=IDS)
def test_each_study_is_its_committed_stage_lines(folder, name, summary, stem):
    """A summary's ranks are the committed lines of one study key, fitted at the target acceptance the
    summary records: the study can be gathered again, or resumed, from the repository alone."""
    by_key = collections.defaultdict(dict)
    for path in stage_files(os.path.join(folder, "stages", f"{stem}.jsonl")):  # the files the study reads
        for unit in read_stage_lines(path):
            by_key[json.dumps(unit["study"], sort_keys=True)][unit["dataset"]] = unit["ranks"]
    keys = [key for key, ranks in by_key.items()
            if [ranks.get(i) for i in range(len(summary["ranks"]))] == summary["ranks"]]
    assert len(keys) == 1, f"{name}: {len(keys)} study keys in {folder}/stages give its summary's ranks"
    assert json.loads(keys[0]).get("target_accept") == summary.get("target_accept")
