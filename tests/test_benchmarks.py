"""The benchmarks compare equal things: points inside the domain, starts that reach the optimum."""

import numpy as np
import scipy.special

from experiments.benchmarks.inference import reached_share
from experiments.benchmarks.numerics import lambertw_points


def test_lambert_w_points_lie_inside_the_real_domain_of_both_branches():
    for k in (0, -1):
        z = lambertw_points(k, 1000)
        assert z.min() >= -1 / np.e and np.isfinite(scipy.special.lambertw(z, k).real).all()


def test_the_share_of_starts_reaching_the_optimum_counts_only_those_within_the_tolerance():
    best = 1.0e-3
    values = np.array([best, best * (1 + 5e-10), best * (1 + 1e-6), np.nan, 2 * best])
    assert reached_share(values, best) == 2 / 5
