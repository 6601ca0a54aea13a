"""The corpus comes from the installed packages, stripped of markup, with a disjoint 5% test split."""

import numpy as np

from sdsl_jax.lm import corpus


def test_corpus_sources_sizes_and_split():
    c = corpus.load_corpus()
    assert c.sources["shakespeare"] > 4_000_000 and c.sources["king_james_bible"] > 4_000_000
    total = sum(c.sources.values())
    assert len(c.train) + len(c.test) == total
    assert 0.04 < len(c.test) / total < 0.06
    text = c.train[:200_000].tobytes().decode("utf-8", errors="replace")
    assert "**" not in text and "\n#" not in text
    assert c.train.dtype == np.uint8


def test_markup_stripping():
    md = "# Hamlet\n\n## ACT I\n\n_Enter BERNARDO_\n\n**BERNARDO**  \nWho's there?  \n"
    assert corpus.strip_play_markup(md) == "Hamlet\n\nACT I\n\nEnter BERNARDO\n\nBERNARDO\nWho's there?\n"


def test_bible_keeps_verses_and_chapters():
    kjv = corpus.king_james_bible()
    assert kjv.startswith("Genesis 1\nIn the beginning God created the heaven and the earth.\n")
    assert "\n\nGenesis 2\n" in kjv


def test_hellaswag_prompts():
    prompts = corpus.hellaswag_prompts()
    assert len(prompts) == 10_003 and all(isinstance(p, str) and p for p in prompts[:100])
