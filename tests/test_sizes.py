"""Sizes are sizes: integer counts reach the maths as floats, with and without x64.

Without x64, JAX's integers are int32: 13_000_000_000 would wrap to -4.1e9 + 2^32 and the solve
would report a wrong N* as solved. Every public entry point converts counts to floating point on the
NumPy side first. The no-x64 half runs in a fresh process (the test session enables x64).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sdsl_jax as sd

# The right answers (float64, float inputs): Hoffmann's law, the paper's plane, D = D' = 1e12.
EXPECTED = np.array([1.0384680e8, 2.7554294e8])

CHECK = r"""
import json, sys
import jax, numpy as np
import sdsl_jax as sd
big = [13_000_000_000, 70_000_000_000]
inputs = {"python ints": big, "int64": np.array(big, np.int64), "uint64": np.array(big, np.uint64),
          "python floats": [1.3e10, 7e10], "tuple": tuple(big)}
out = {"x64": bool(jax.config.jax_enable_x64)}
for name, m in inputs.items():
    sol = sd.solve_draft_size(m, d_draft=10**12, d_target=10**12)
    out[name] = [np.asarray(sol.n_star).tolist(), np.asarray(sol.status).tolist()]
out["scalar int"] = float(sd.optimal_draft_size(70_000_000_000, d_draft=10**12, d_target=np.int64(10**12)))
out["int32 small"] = float(sd.optimal_draft_size(np.int32(2_000_000_000), d_draft=10**12, d_target=10**12))
out["throughput"] = np.asarray(sd.draft_throughput(np.int64(100_000_000), np.array(big), d_draft=10**12,
                                                   d_target=10**12)).tolist()
out["throughput floats"] = np.asarray(sd.draft_throughput(1e8, np.array([1.3e10, 7e10]), d_draft=1e12,
                                                          d_target=1e12)).tolist()
try:
    sd.solve_draft_size(np.array([1e40]), d_draft=1e12, d_target=1e12)
    out["beyond float32"] = "accepted"
except ValueError as err:
    out["beyond float32"] = str(err)
print(json.dumps(out))
"""


@pytest.mark.parametrize("x64", [True, False])
def test_integer_sizes_give_the_right_n_star_with_and_without_x64(x64, capsys):
    if x64:  # this session runs with x64
        exec(CHECK, {})
        out = json.loads(capsys.readouterr().out)
    else:
        env = dict(os.environ, JAX_ENABLE_X64="0", SDSL_JAX_COMPILE_CACHE="off")
        run = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout)
    assert out["x64"] is x64
    rtol = 1e-6 if x64 else 2e-3  # float32 locates the flat maximum to about 1e-3
    for name in ("python ints", "int64", "uint64", "python floats", "tuple"):
        n_star, status = out[name]
        assert status == [0, 0], name
        np.testing.assert_allclose(n_star, EXPECTED, rtol=rtol, err_msg=name)
    np.testing.assert_allclose(out["scalar int"], EXPECTED[1], rtol=rtol)
    assert np.isfinite(out["int32 small"]) and out["int32 small"] > 1e7
    np.testing.assert_allclose(out["throughput"], out["throughput floats"], rtol=1e-6)
    if x64:
        assert out["beyond float32"] == "accepted"
    else:
        assert "exceeds the range of float32" in out["beyond float32"]


def test_lists_scalars_numpy_and_jax_arrays_are_accepted_alike():
    import jax.numpy as jnp

    reference = sd.solve_draft_size(np.array([1.3e10, 7e10]), d_draft=1e12, d_target=1e12)
    for m in ([1.3e10, 7e10], (1.3e10, 7e10), jnp.array([1.3e10, 7e10]), [13_000_000_000, 70_000_000_000]):
        sol = sd.solve_draft_size(m, d_draft=1e12, d_target=1e12)
        np.testing.assert_allclose(sol.n_star, reference.n_star, rtol=1e-12)
        assert sol.n_star.shape == (2,)
    np.testing.assert_allclose(reference.n_star, EXPECTED, rtol=1e-6)
