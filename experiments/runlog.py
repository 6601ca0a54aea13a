"""What every experiment run shares: timestamped progress, provenance (versions, hashes) and atomic JSON."""

from __future__ import annotations

import hashlib
import json
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


def write_json(path: str, obj) -> None:
    """Write ``obj`` as JSON atomically (a temporary file renamed into place)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)
