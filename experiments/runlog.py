"""What every experiment run shares: timestamped progress, provenance (versions, hashes) and atomic JSON."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from importlib import metadata


class Log:
    """``log(msg)`` prints ``[elapsed] msg`` unless quiet."""

    def __init__(self, quiet: bool = False):
        self.quiet, self.t0 = quiet, time.perf_counter()

    def __call__(self, msg: str, end: str = "\n") -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", end=end, flush=True)


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


def configure_jax(*, devices: int = 4) -> None:
    """Process-wide JAX settings of the CLIs, made in ``main`` (never at import).

    ``devices`` CPU devices let NUTS run its chains in parallel; the flag only takes effect when
    JAX has not started its backends yet (as in a fresh ``python -m``). Float64 is needed by the
    Huber fit and N*.
    """
    import jax

    if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={devices}").strip()
    jax.config.update("jax_enable_x64", True)
