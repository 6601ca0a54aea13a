"""Test configuration: float64 available everywhere, strict dtype promotion, 4 CPU devices.

Tests that check float32 behaviour pass float32 arrays explicitly; everything else runs in
float64, where the accuracy targets are stated.
"""

import os

# Multi-device paths (sharding) are exercised on the CPU; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
# The CLIs' persistent compilation cache stays out of the user's home while testing (a test turns
# it on explicitly in a temporary folder).
os.environ.setdefault("SDSL_JAX_COMPILE_CACHE", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
    """Run a numeric test both as plain calls and under ``jax.jit``."""
    if request.param == "eager":
        return lambda f, **kw: f
    return lambda f, **kw: jax.jit(f, **kw)


@pytest.fixture(scope="session")
def micro_ladder(tmp_path_factory):
    """The micro ladder trained and measured once per session: ``(ladder_dir, measure_dir)``."""
    from experiments import ladder, measure

    root = tmp_path_factory.mktemp("micro_ladder")
    ladder_dir, measure_dir = root / "ladder", root / "measure"
    assert ladder.main(["--preset", "micro", "--out", str(ladder_dir), "--quiet"]) == 0
    assert measure.main(["--preset", "micro", "--ladder", str(ladder_dir), "--out", str(measure_dir), "--quiet"]) == 0
    return ladder_dir, measure_dir


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`make test` runs two workers), every test of the session-scoped micro
    # ladder goes to one worker (--dist loadgroup), so the ladder is trained once, not per worker.
    for item in items:
        if "micro_ladder" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("micro_ladder"))
