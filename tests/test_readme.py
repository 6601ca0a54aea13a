"""The README is a guide a user runs: every ```python block executes, links resolve, it stays short."""

import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_python_blocks_and_stays_a_guide():
    assert BLOCKS
    assert len(README.encode()) <= 15_000
    for forbidden in ("/tmp/", "here on ", "this session"):
        assert forbidden not in README


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_python_block_of_the_readme_runs(index):
    namespace = {}
    exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), namespace)
    if "sol" in namespace:  # the examples solve: an example that reports a failure as its answer is no guide
        import numpy as np

        assert np.all(np.asarray(namespace["sol"].status) == 0)


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = ["README.md"] + [os.path.join("docs", p) for p in os.listdir(os.path.join(ROOT, "docs")) if p.endswith(".md")]
    pages += [os.path.join("docs", "results", p) for p in os.listdir(os.path.join(ROOT, "docs", "results"))]
    for page in pages:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for target in re.findall(r"\]\(([^)#\s]+)\)", text):
            if "://" in target:
                continue
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
            assert os.path.exists(path), f"{page}: link {target} does not resolve"
