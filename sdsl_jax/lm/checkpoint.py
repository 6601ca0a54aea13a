"""Orbax checkpoints of training state: a synchronous manager and restoring the latest step.

Used by the training loop (``sdsl_jax.lm.train``) and the model ladder; restoring into the
structure of a live state keeps shardings and dtypes, so a resumed run continues bit for bit.
"""

from __future__ import annotations

import os

import jax

__all__ = ["checkpoint_manager", "restore_latest"]


def checkpoint_manager(directory: str, keep: int = 2):
    """An orbax manager keeping the ``keep`` latest checkpoints in ``directory`` (synchronous saves)."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def restore_latest(manager, like):
    """The latest checkpoint of ``manager`` restored with the structure of ``like``; None when there is none."""
    import orbax.checkpoint as ocp

    step = manager.latest_step()
    if step is None:
        return None
    return manager.restore(step, args=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, like)))
