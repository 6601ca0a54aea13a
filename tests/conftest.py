"""Test configuration: float64 available everywhere, strict dtype promotion, 4 CPU devices.

Tests that check float32 behaviour pass float32 arrays explicitly; everything else runs in
float64, where the accuracy targets are stated.
"""

import os

# Multi-device paths (sharding) are exercised on the CPU; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
# The suite's time is XLA compiling programs that then run for milliseconds; XLA's older CPU
# emitters and LLVM's level-1 optimisation compile faster, its default fusion emitters and level 3
# make faster code (what a user's large batch wants, so the library keeps them). Level 0 is not used:
# it compiles little faster and gives two programs of the same draws different roundings. Measured
# in docs/benchmarks.md. `make test-all` keeps XLA's defaults (SDSL_TEST_XLA_DEFAULTS=1), so both
# code paths are tested.
if os.environ.get("SDSL_TEST_XLA_DEFAULTS") != "1":
    for flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=1"):
        if flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
            os.environ["XLA_FLAGS"] += " " + flag
# The CLIs' persistent compilation cache stays out of the user's home while testing (a test turns
# it on explicitly in a temporary folder).
os.environ.setdefault("SDSL_JAX_COMPILE_CACHE", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


def pytest_configure(config):
    """One JAX persistent compilation cache for the whole run, in a temporary folder.

    Set in the controlling process before pytest-xdist starts its workers, so that the workers,
    the CLIs they call and the notebooks' subprocesses (which read ``JAX_COMPILATION_CACHE_DIR``
    at import) load a program another process of this run compiled already (the same NumPyro
    model on the same data, the solver at the same shapes) instead of compiling it again. A
    fresh folder per run: nothing is carried over from an earlier run or a user's own cache.
    """
    import tempfile

    if hasattr(config, "workerinput") or os.environ.get("SDSL_TEST_COMPILE_CACHE") == "off":
        return
    folder = tempfile.mkdtemp(prefix="sdsl-jax-test-xla-")
    config._sdsl_compile_cache = folder
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    jax.config.update("jax_compilation_cache_dir", folder)  # this process imported jax already
    # Programs that compile in 0.2-1 s (JAX caches from 1 s by default) are shared too, as the CLIs
    # share theirs (sdsl_jax.runtime): both workers compile many of the same ones.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


def pytest_unconfigure(config):
    import shutil

    folder = getattr(config, "_sdsl_compile_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
    """Run a numeric test both as plain calls and under ``jax.jit``."""
    if request.param == "eager":
        return lambda f, **kw: f
    return lambda f, **kw: jax.jit(f, **kw)


@pytest.fixture(scope="session")
def micro_ladder(tmp_path_factory):
    """The micro ladder trained and measured once per test run: ``(ladder_dir, measure_dir)``.

    Under pytest-xdist every worker is its own session; the ladder is built once in the folder the
    workers share (the parent of their base temporary folders), under a file lock: the first worker
    trains it, the others wait and reuse it.
    """
    import fcntl

    from experiments import ladder, measure

    worker_root = tmp_path_factory.getbasetemp()
    shared = worker_root.parent if os.environ.get("PYTEST_XDIST_WORKER") else worker_root
    root = shared / "micro_ladder"
    ladder_dir, measure_dir = root / "ladder", root / "measure"
    root.mkdir(exist_ok=True)
    with open(shared / "micro_ladder.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            # One device: the four this suite's processes see are two cores here, and splitting a
            # micro batch over them costs more than it shares (the data-parallel path is
            # test_train's and test_experiments' resume test's).
            assert ladder.main(["--preset", "micro", "--devices", "1", "--out", str(ladder_dir), "--quiet"]) == 0
            assert measure.main(["--preset", "micro", "--ladder", str(ladder_dir), "--out", str(measure_dir),
                                 "--quiet"]) == 0
            (root / "done").write_text("ok")
    return ladder_dir, measure_dir


# The modules that take longest, longest first (their worker-seconds in `make test`, from
# `pytest --durations=0`): pytest-xdist hands whole modules to its two workers in collection order
# (--dist loadscope with --no-loadscope-reorder, set in the Makefile; xdist's own reorder counts tests,
# not seconds), so a long module collected last would keep one worker busy while the other idles.
# The micro ladder's other user (test_latency) comes late, after test_experiments has built the
# ladder it waits for.
LONGEST_FIRST = ("test_experiments", "test_fit_cli", "test_optimum", "test_faults", "test_fitting", "test_extending",
                 "test_bayes", "test_decoding", "test_calibration", "test_misspecified", "test_model_effects",
                 "test_compare", "test_holdout", "test_run_effects", "test_sbc", "test_lambertw", "test_speculative",
                 "test_effect_coordinates", "test_measure_core", "test_predictive", "test_train", "test_normal",
                 "test_coefficient_coordinates", "test_composable", "test_validation", "test_user_data",
                 "test_latency", "test_sizes", "test_readme")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1] if item.module else "",
                                         len(rank)))
