"""Process-wide JAX settings for the commands (and for any script that wants the same): float64, CPU
devices for parallel chains, and JAX's persistent compilation cache. Made when called, never at import.
"""

from __future__ import annotations

import os
import sys
import tempfile

__all__ = ["COMPILE_CACHE_ENV", "WIDE_CPU_VECTORS", "default_compile_cache", "configure_jax"]


COMPILE_CACHE_ENV = "SDSL_JAX_COMPILE_CACHE"
"""Environment variable: the compilation-cache folder of the CLIs, or ``off``."""

WIDE_CPU_VECTORS = {"xla_cpu_prefer_vector_width": 512}
"""Compiler options for ``jax.jit(f, compiler_options=WIDE_CPU_VECTORS)``: XLA's CPU backend then
vectorises with 512-bit registers where the CPU has them (AVX-512). XLA prefers 256-bit ones by
default, since some CPUs lower their clock for 512-bit work; on those that do not, long elementwise
programs such as the float64 Lambert W gain, and others can lose (the N* solver's loop runs slower):
measure your program both ways (``docs/benchmarks.md`` has both comparisons).
Elementwise programs give the same results either way; a reduction may sum in another order. Per
program, not per process: the CLIs do not set it, so their results stay those of XLA's defaults."""


def default_compile_cache() -> str | None:
    """``$SDSL_JAX_COMPILE_CACHE`` (``off`` disables it), else ``$XDG_CACHE_HOME/sdsl-jax/xla``
    (``~/.cache/sdsl-jax/xla``)."""
    value = os.environ.get(COMPILE_CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "none") else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sdsl-jax", "xla")


_DEFAULT = object()


def configure_jax(*, devices: int = 4, compile_cache=_DEFAULT) -> None:
    """Process-wide JAX settings of the CLIs, made in ``main`` (never at import).

    ``devices`` CPU devices let NUTS run its chains in parallel; the flag only takes effect when
    JAX has not started its backends yet (as in a fresh ``python -m``). Float64 is needed by the
    Huber fit and N*. ``compile_cache`` is JAX's persistent compilation cache folder (default
    :func:`default_compile_cache`; None: off): a second run of the same command loads its
    compiled programs instead of compiling them again.
    """
    import jax

    if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={devices}").strip()
    jax.config.update("jax_enable_x64", True)
    folder = default_compile_cache() if compile_cache is _DEFAULT else compile_cache
    if folder:
        try:  # the cache is optional: a folder that cannot be written turns it off, with one line
            os.makedirs(folder, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            print(f"warning: compilation cache {folder} cannot be used ({err.strerror or err}); running without it "
                  f"(set {COMPILE_CACHE_ENV}=off to silence this)", file=sys.stderr)
            return
        jax.config.update("jax_compilation_cache_dir", folder)
        # Every program: a run of the commands compiles a few hundred small ones, and loading them
        # costs less than compiling them (measured in docs/benchmarks.md).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
