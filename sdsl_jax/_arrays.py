"""Array conversion shared by the library's pure functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def as_float(*xs: ArrayLike) -> tuple[jax.Array, ...]:
    """Convert to arrays of one common floating dtype.

    Floating inputs decide the dtype (float32 stays float32; Python floats are weak and follow
    the arrays); integer inputs are promoted to it, or to the default float when no input is
    floating. Works under ``jax_numpy_dtype_promotion = "strict"``.
    """
    arrays = [jnp.asarray(x) for x in xs]
    floating = [a for a in arrays if jnp.issubdtype(a.dtype, jnp.floating)]
    dtype = jnp.result_type(*floating) if floating else jnp.result_type(float)
    return tuple(a.astype(dtype) for a in arrays)
