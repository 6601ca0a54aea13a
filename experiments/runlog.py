"""What every experiment run shares: timestamped progress, provenance (versions, hashes) and atomic JSON."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import sys
import threading
import time
from importlib import metadata
from typing import Callable


class Log:
    """``log(msg)`` prints ``[elapsed] msg`` unless quiet.

    ``with log.heartbeat(10):`` keeps a long step from looking hung: whenever nothing has been
    printed for ``seconds``, a line says which step is still running and for how long (from a
    daemon thread, so it also speaks during one long compiled call such as NUTS).
    """

    def __init__(self, quiet: bool = False):
        self.quiet, self.t0 = quiet, time.perf_counter()
        self._last_time, self._last_msg = self.t0, ""
        self._lock = threading.Lock()

    def __call__(self, msg: str, end: str = "\n") -> None:
        with self._lock:
            now = time.perf_counter()
            self._last_time, self._last_msg = now, msg if not msg.startswith("  ... ") else self._last_msg
            if not self.quiet:
                print(f"[{now - self.t0:6.1f}s] {msg}", end=end, flush=True)

    @contextlib.contextmanager
    def heartbeat(self, seconds: float = 10.0):
        if self.quiet:
            yield
            return
        stop = threading.Event()

        def beat():
            while not stop.wait(0.25):
                with self._lock:
                    silent, step = time.perf_counter() - self._last_time, self._last_msg
                if silent >= seconds:
                    self(f"  ... still working on: {_shorten(step)}")

        thread = threading.Thread(target=beat, name="sdsl-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _shorten(text: str, width: int = 90) -> str:
    text = text.strip().splitlines()[0] if text.strip() else "(starting)"
    return text if len(text) <= width else text[: width - 3] + "..."


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("sdsl-jax", "jax", "jaxlib", "numpy", "optax", "flax", "orbax-checkpoint", "numpyro", "arviz"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _finite_or_none(obj):
    """NaN and infinities as None (JSON null), recursively: strict JSON parsers reject NaN."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


def write_json(path: str, obj, *, strict: bool = False) -> None:
    """Write ``obj`` as JSON atomically (a temporary file renamed into place).

    ``strict=True`` writes standard JSON: NaN and infinities become null (each summary records the
    status that says why a value is missing).
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if strict:
        obj = _finite_or_none(obj)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, allow_nan=not strict)
        f.write("\n")
    os.replace(tmp, path)


COMPILE_CACHE_ENV = "SDSL_JAX_COMPILE_CACHE"
"""Environment variable: the compilation-cache folder of the CLIs, or ``off``."""


def default_compile_cache() -> str | None:
    """``$SDSL_JAX_COMPILE_CACHE`` (``off`` disables it), else ``$XDG_CACHE_HOME/sdsl-jax/xla``
    (``~/.cache/sdsl-jax/xla``)."""
    value = os.environ.get(COMPILE_CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "none") else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sdsl-jax", "xla")


_DEFAULT = object()


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file renamed into place)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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
        os.makedirs(folder, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", folder)
        # Only programs worth caching: tiny ones cost more to look up than to compile.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def exit_on_interrupt(run: Callable[[], int], kept: str) -> int:
    """``run()``, but Ctrl-C ends it with one line saying what is kept and exit status 130.

    ``kept`` says what survives and how to continue, e.g. "finished stages are kept in out/;
    rerun the same command to continue". Every CLI writes its results atomically, so an
    interruption loses at most the unit of work in flight.
    """
    try:
        return run()
    except KeyboardInterrupt:
        print(f"\ninterrupted: {kept}", file=sys.stderr)
        return 130
