"""Array conversion shared by the library's pure functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike


def as_float(*xs: ArrayLike, host: bool = False) -> tuple[jax.Array | np.ndarray, ...]:
    """Convert to arrays of one common floating dtype.

    Floating inputs decide the dtype (float32 stays float32; Python floats are weak and follow
    the arrays); integer inputs are promoted to it, or to the default float when no input is
    floating. Works under ``jax_numpy_dtype_promotion = "strict"``.

    Sizes and token counts are counts, often given as integers (``13_000_000_000``,
    ``np.array([...], np.int64)``): integers that JAX has not seen yet are converted to float on
    the NumPy side, so they never pass through JAX's int32 (which wraps 1.3e10 silently when
    x64 is off). Lists and tuples are arrays. A concrete value beyond the chosen float's range
    (float32 without x64) is a ``ValueError``, not an infinity.

    ``host=True`` leaves NumPy inputs as NumPy arrays of the chosen dtype: for arguments of a
    jitted function, whose C++ dispatch transfers them in one step instead of one Python
    ``device_put`` per leaf (most of a small call's time).
    """
    converted = [_as_array(x) for x in xs]
    floating = [a for a, weak in converted if not weak and jnp.issubdtype(a.dtype, jnp.floating)]
    dtype = jnp.result_type(*floating) if floating else jnp.result_type(float)
    out = []
    for a, _ in converted:
        if isinstance(a, np.ndarray):
            _check_range(a, dtype)
        if isinstance(a, np.ndarray):
            out.append(a.astype(dtype, copy=False) if host else jnp.asarray(a, dtype))
        else:
            out.append(a.astype(dtype))
    return tuple(out)


def _as_array(x) -> tuple[jax.Array | np.ndarray, bool]:
    """``(array, weak)``: JAX arrays and tracers as they are, anything else through NumPy.

    ``weak``: the value does not decide the dtype (integers, and Python floats as in JAX).
    """
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return x, False
    if isinstance(x, float) and not isinstance(x, np.generic):
        return np.asarray(x, np.float64), True
    a = np.asarray(x)
    if a.dtype.kind in "iub":
        return a.astype(np.float64), True
    if a.dtype.kind != "f":
        raise TypeError(f"expected numbers, got {a.dtype} ({x!r:.60})")
    return a, False


def _check_range(a: np.ndarray, dtype) -> None:
    limit = float(jnp.finfo(dtype).max)
    finite = a[np.isfinite(a)]
    if finite.size and float(np.max(np.abs(finite))) > limit:
        raise ValueError(f"{float(np.max(np.abs(finite))):.4g} exceeds the range of {jnp.dtype(dtype).name} "
                         f"({limit:.4g}): enable float64 (jax.config.update('jax_enable_x64', True))")
