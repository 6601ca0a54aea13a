"""The shipped datasets and their analysis defaults, in one place.

Each entry names its files and the scale at which it is analysed: the target sizes of the N*(M)
grid and the named targets, the training budgets of drafts and targets, and whether the paper's
line N* = mu M + M0 belongs on its figures (only at the paper's scale). The fit CLI, the closure,
the figures and the tests read these; a new dataset is one entry here (README, "Extending").
"""

from __future__ import annotations

import dataclasses
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A shipped dataset and its analysis defaults.

    Attributes:
      name: the CLI name (``--dataset``).
      description: one line for ``--help``.
      pretraining: pre-training runs CSV (``sdsl-pretraining``).
      acceptance: acceptance CSV (``sdsl-acceptance``), or None: the paper's plane is used.
      speculative: speculative-decoding runs CSV (``sdsl-speculative``), or None.
      drop_highest_loss: runs dropped before fitting (the Epoch replication drops 5).
      m_min, m_max: range of the N*(M) grid.
      targets: named targets of the table and the throughput figure.
      d_draft, d_target: training tokens of drafts and targets.
      compare_to_paper: draw the paper's N* = mu M + M0 line (only meaningful at its scale).
      one_run_per_row: every row is its own training run, whatever its size (``--run-effects
        auto`` then keeps rows independent). Chinchilla's points are read off a figure without
        their run structure, so sizes that repeat are not known to be one run.
    """

    name: str
    description: str
    pretraining: str
    acceptance: str | None
    speculative: str | None
    drop_highest_loss: int
    m_min: float
    m_max: float
    targets: tuple[float, ...]
    d_draft: float
    d_target: float
    compare_to_paper: bool
    one_run_per_row: bool = False


# Both ladders are predicted for the same targets, so their answers compare; only their budgets differ.
_LADDER_SETTINGS = dict(drop_highest_loss=0, m_min=5e4, m_max=2e6, targets=(1.2e5, 2.6e5, 4.8e5, 1.2e6),
                       compare_to_paper=False)

DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset(
            name="chinchilla",
            description="Hoffmann et al. Fig. 4 runs (fits/data/chinchilla_fig4.csv); plane fixed at the paper's; "
                        "targets 10B-110B, D = D' = 1e12",
            pretraining=os.path.join(REPO, "fits", "data", "chinchilla_fig4.csv"), acceptance=None, speculative=None,
            drop_highest_loss=5, m_min=1e10, m_max=1.1e11, targets=(13e9, 30e9, 70e9, 110e9), d_draft=1e12,
            d_target=1e12, compare_to_paper=True, one_run_per_row=True),
        Dataset(
            name="ladder",
            description="our trained model ladder (fits/ladder/): 9 sizes x 5 shared budgets (45 runs), exact alpha "
                        "of 180 pairs, no speculative runs; targets 50k-2M, D = D' = 1e7",
            pretraining=os.path.join(REPO, "fits", "ladder", "pretraining.csv"),
            acceptance=os.path.join(REPO, "fits", "ladder", "acceptance.csv"),
            speculative=None, d_draft=1e7, d_target=1e7, **_LADDER_SETTINGS),
        Dataset(
            name="ladder-v1",
            description="the first ladder (fits/ladder-v1/): 7 sizes at 4 budgets tied to N, exact alpha of 84 pairs, "
                        "speculative runs; targets 50k-2M, D = D' = 5e6",
            pretraining=os.path.join(REPO, "fits", "ladder-v1", "pretraining.csv"),
            acceptance=os.path.join(REPO, "fits", "ladder-v1", "acceptance.csv"),
            speculative=os.path.join(REPO, "fits", "ladder-v1", "speculative.csv"), d_draft=5e6, d_target=5e6,
            **_LADDER_SETTINGS),
    )
}
