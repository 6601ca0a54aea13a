"""NUTS runs and their checks.

Several chains (vectorised on one device, one per device when there are enough), each started
from its own draw of the prior so that R-hat can see disagreement.
A sampler is compiled once per model and data shapes and reused (calibration and closures fit
the same model to many same-shaped datasets). Every run is checked (:func:`check_diagnostics`):
split R-hat, bulk ESS, divergences and the share of draws at NUTS's maximum tree depth.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.util
from numpyro.distributions.transforms import biject_to
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import log_density

with warnings.catch_warnings():  # ArviZ announces its refactor on import; the one quiet import, used package-wide
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

__all__ = [
    "Diagnostics",
    "PosteriorRun",
    "check_diagnostics",
    "MAX_TREE_DEPTH",
    "compiled_loop_reuse",
    "clear_sampler_caches",
    "release_compiled_programs_when_crowded",
    "run_nuts",
    "prior_starts",
]


class Diagnostics(NamedTuple):
    """Convergence checks of a posterior run; ``ok`` is False when any check fails.

    ``mean_steps`` and ``median_steps`` (leapfrog steps per draw) and ``max_tree_depth_share`` (the
    share of draws whose trajectory reached NUTS's maximum tree depth) describe the sampler's
    geometry (NUTS doubles a trajectory, so a draw takes 2^j - 1 steps): hundreds of steps
    per draw, or many draws at the cap, mean a badly scaled posterior that costs time; more than 1%
    at the cap fails the checks. NaN where not recorded. ``attempts``: the runs made to get
    these (more than one when earlier runs failed their checks and the sampler ran again,
    :func:`sdsl_jax.infer.posterior.rerun_until_checked`).
    """

    max_rhat: float
    min_ess_bulk: float
    num_divergences: int
    ok: bool
    problems: tuple[str, ...]
    mean_steps: float = float("nan")
    max_tree_depth_share: float = float("nan")
    median_steps: float = float("nan")
    attempts: int = 1

    @classmethod
    def from_record(cls, record) -> "Diagnostics":
        """The diagnostics a result file records (``_asdict()`` written as JSON); fields the record
        lacks take their defaults (NaN: not recorded). Raises ``ValueError`` naming a missing check
        or a field that is not one of these."""
        unknown = sorted(set(record) - set(cls._fields))
        missing = [f for f in cls._fields if f not in cls._field_defaults and f not in record]
        if unknown or missing:
            raise ValueError("not a posterior's diagnostics: "
                             + "; ".join(([f"unknown fields {unknown}"] if unknown else [])
                                         + ([f"missing {missing}"] if missing else [])))
        # Strict JSON writes NaN as null (sdsl_jax.store.finite_or_none).
        real = ("max_rhat", "min_ess_bulk", "mean_steps", "max_tree_depth_share", "median_steps")
        values = {k: (float("nan") if v is None and k in real else v) for k, v in record.items()}
        return cls(**{**values, "problems": tuple(record["problems"])})


class PosteriorRun(NamedTuple):
    """A finished NUTS run: draws per site (chains flattened), ArviZ data, diagnostics."""

    samples: dict[str, np.ndarray]
    inference_data: az.InferenceData | None
    diagnostics: Diagnostics | None


def check_diagnostics(
    idata: az.InferenceData, divergences: int, *, var_names, max_rhat: float = 1.01, min_ess: float | None = None,
    num_steps=None, max_tree_depth: int = 10, max_tree_depth_share: float = 0.01,
) -> Diagnostics:
    """Split R-hat (rank-normalised), bulk ESS, divergences and NUTS's tree depth against the usual thresholds.

    Thresholds follow Vehtari et al. (2021), "Rank-normalization, folding, and localization":
    R-hat < 1.01 and bulk ESS above 100 per chain (``min_ess`` by default; 400 for the usual four
    chains, as Stan's own check has it); any divergence is reported. More than
    ``max_tree_depth_share`` of the draws at the maximum tree depth fails too: trajectories cut
    short explore slowly, and cost the most time a draw can.
    """
    rhat = az.rhat(idata, var_names=list(var_names))
    ess = az.ess(idata, var_names=list(var_names), method="bulk")
    worst_rhat = max(float(np.max(rhat[v].values)) for v in var_names)
    worst_ess = min(float(np.min(ess[v].values)) for v in var_names)
    if min_ess is None:
        min_ess = 100.0 * idata.posterior.sizes["chain"]
    problems = []
    if not worst_rhat < max_rhat:
        problems.append(f"R-hat {worst_rhat:.3f} >= {max_rhat} (chains disagree)")
    if not worst_ess > min_ess:
        problems.append(f"bulk ESS {worst_ess:.0f} <= {min_ess:.0f} (too few effective draws)")
    if divergences:
        problems.append(f"{divergences} divergent transitions")
    steps = np.asarray(num_steps if num_steps is not None else np.nan, np.float64).ravel()
    at_cap = float(np.mean(steps >= 2**max_tree_depth - 1)) if num_steps is not None else float("nan")
    if at_cap > max_tree_depth_share:
        problems.append(f"{at_cap:.0%} of draws at the maximum tree depth (trajectories cut short: a curved or "
                        "weakly identified posterior, such as an exponent the data's sizes barely pin down; more "
                        "data over a wider range, or a form with fewer coefficients)")
    return Diagnostics(worst_rhat, worst_ess, int(divergences), not problems, tuple(problems),
                       float(np.mean(steps)), at_cap, float(np.median(steps)))


def _chain_method(num_chains: int) -> str:
    return "parallel" if jax.local_device_count() >= num_chains > 1 else "vectorized"


MAX_TREE_DEPTH = 10
"""NUTS's maximum tree depth (NumPyro's default): at most 2^10 - 1 leapfrog steps per draw."""


class _ReinitialisableNUTS(NUTS):
    """NUTS whose initialisation for vectorised chains can be repeated, and is compiled for one chain.

    NumPyro's HMC ``init`` wraps the kernel's sampling function in ``vmap`` every time it starts
    vectorised chains. A cached MCMC (:func:`_mcmc`) is initialised again on every run; its
    compiled sampling loop, traced on the first run, hides the extra wrappers until JAX traces it
    again (its program evicted or its caches cleared), when the twice-mapped function fails on the
    chains' states. Each initialisation here starts from the unmapped function.
    """

    _unmapped_sample_fn = None
    _compiled_init = None

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs={}):
        if self._unmapped_sample_fn is not None:
            self._sample_fn = self._unmapped_sample_fn
        if (numpyro.util.is_prng_key(rng_key) and init_params is not None and not model_kwargs
                and numpyro.util.not_jax_tracer(rng_key)):
            # One chain: NumPyro initialises it operation by operation, each compiled on its own
            # at every new data shape (the potential and its gradient twice, the step-size search);
            # compiled as one program, as it is inside the mapped chains of a multi-chain run.
            if self._compiled_init is None or self._compiled_init[0] != num_warmup:
                self._compiled_init = (num_warmup, jax.jit(
                    lambda key, params, args: super(_ReinitialisableNUTS, self).init(
                        key, num_warmup, params, model_args=args)))
            return self._compiled_init[1](rng_key, init_params, model_args)
        state = super().init(rng_key, num_warmup, init_params, model_args=model_args, model_kwargs=model_kwargs)
        if not numpyro.util.is_prng_key(rng_key):  # vectorised chains: init mapped the function
            self._unmapped_sample_fn = self._sample_fn.__wrapped__
        return state


@functools.lru_cache(maxsize=16)
def _mcmc(model, num_chains, num_warmup, num_samples, progress_bar, target_accept, dense_mass=False,
          shapes=()) -> MCMC:
    # Reused across calls with data of the same shapes (jit_model_args): repeated fits, such as
    # calibration over many synthetic datasets, compile once. ``shapes`` (of the data and the
    # starting points) is only part of the key: an MCMC object holds state traced for one set of
    # shapes (its vectorised chains fail on another), so other shapes get their own.
    return MCMC(
        _ReinitialisableNUTS(model, target_accept_prob=target_accept, dense_mass=dense_mass,
                             max_tree_depth=MAX_TREE_DEPTH),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains, chain_method=_chain_method(num_chains), progress_bar=progress_bar,
        jit_model_args=True,
    )


@functools.lru_cache(maxsize=32)
def _jitted_once(fn, args, kwargs):
    return _NUMPYRO_MAYBE_JIT(fn, *args, **dict(kwargs))


def _memoised_maybe_jit(fn, *args, **kwargs):
    try:
        return _jitted_once(fn, args, tuple(sorted(kwargs.items())))
    except TypeError:  # unhashable options: as NumPyro does
        return _NUMPYRO_MAYBE_JIT(fn, *args, **kwargs)


_NUMPYRO_MAYBE_JIT = getattr(numpyro.util, "maybe_jit", None)


@contextlib.contextmanager
def _sampling_loop_compiled_once():
    """Let a cached MCMC reuse its compiled sampling loop for new data of the same shapes.

    NumPyro's ``fori_collect`` caches its loop body but wraps it in a NEW ``jax.jit`` object on
    every run, and passes that object as a static argument of the jitted loop: the loop is
    compiled again on every run (most of a small posterior's time; ``make bench``'s ``nuts``
    section measures it). Returning the same jit wrapper for the same function and options makes
    the second run of one model on same-shaped data compile nothing; the computation, and so
    every draw, is unchanged. Calibration over many synthetic datasets and repeated fits profit;
    chains mapped over devices are traced anew by NumPyro anyway. Without
    ``numpyro.util.maybe_jit`` (another NumPyro) this does nothing.
    """
    if _NUMPYRO_MAYBE_JIT is None:
        yield
        return
    numpyro.util.maybe_jit = _memoised_maybe_jit
    try:
        yield
    finally:
        numpyro.util.maybe_jit = _NUMPYRO_MAYBE_JIT


_reuse_loops = True


@contextlib.contextmanager
def compiled_loop_reuse(enabled: bool):
    """Within the block, reuse NumPyro's compiled sampling loop across same-shaped runs (the
    default) or not (NumPyro's own behaviour, which compiles the loop again on every run): the
    benchmark of the reuse compares both. The draws are the same either way."""
    global _reuse_loops
    previous, _reuse_loops = _reuse_loops, enabled
    try:
        yield
    finally:
        _reuse_loops = previous


def clear_sampler_caches() -> None:
    """Forget every compiled sampler (ours, NumPyro's loop cache and JAX's), e.g. between studies
    that would otherwise keep many programs alive."""
    _mcmc.cache_clear()
    _jitted_once.cache_clear()
    getattr(numpyro.util.fori_collect, "_cache", {}).clear()
    jax.clear_caches()
    gc.collect()  # programs held in reference cycles release their memory now, not at some later collection


def _memory_map_use() -> tuple[int, int] | None:
    """``(mappings this process holds, the kernel's limit vm.max_map_count)``; None off Linux."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f), limit
    except (OSError, ValueError):
        return None


def release_compiled_programs_when_crowded(share: float = 0.75, *, min_available: float = 0.2) -> bool:
    """Forget every compiled program (:func:`clear_sampler_caches`) when this process holds more
    than ``share`` of the memory mappings the kernel allows, or when the machine has less than
    ``min_available`` of its memory left; returns whether it did.

    XLA's CPU backend maps memory for each compiled program and keeps it while the program is
    cached. A long job that compiles for many data shapes (a stacked closure refits every form
    on each data set) reaches Linux's ``vm.max_map_count`` (65,530 by default) after some
    thousands of programs, and LLVM then fails to allocate and the process dies. Dropping the
    caches releases the mappings; what is needed again is compiled again. Called before every
    NUTS run (:func:`run_nuts`), between units of work.

    Why three quarters: one synthetic closure of the stacked procedure (six forms) compiles about
    2,200 programs and maps about 27,000 regions the first time, and the same programs again in
    every later closure of a study, since the shapes repeat. Dropped at half the limit, the caches
    would go in every closure and each would compile everything again; at three quarters they are
    kept, and the quarter left (16,000 mappings) is three times what the work between two NUTS runs
    maps at most (a closure's scoring of its targets, about 4,700).

    Why memory too: the cached programs and what they hold also take resident memory, which a
    long study's process keeps adding to, closure after closure, below the mappings' threshold;
    and several shards share one machine. When its available memory falls under
    ``min_available`` of the total, each process that reaches this point drops its caches rather
    than let the kernel kill one of them.
    """
    use = _memory_map_use()
    crowded = use is not None and use[0] > share * use[1]
    available = _available_memory_share()
    if not crowded and (available is None or available >= min_available):
        return False
    clear_sampler_caches()
    return True


def _available_memory_share() -> float | None:
    """The machine's available memory over its total (``MemAvailable / MemTotal``); None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) / int(fields["MemTotal"].split()[0])
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return None


def _draw_chunk(num_samples: int, pieces: int = 5) -> int:
    """The draws per chain of each progress report: a divisor of ``num_samples`` near a fifth of it,
    so that every piece runs one compiled loop (``num_samples`` itself when none fits)."""
    target = max(1, num_samples // pieces)
    sizes = [k for k in range(max(1, target // 2), num_samples // 2 + 1) if num_samples % k == 0]
    return min(sizes, key=lambda k: (abs(k - target), k)) if sizes else num_samples


def run_nuts(model, model_args, *, init_params, var_names, num_chains, num_warmup, num_samples, seed,
              progress_bar, target_accept, summarize, dense_mass=False,
              progress: Callable[[str], None] | None = None) -> PosteriorRun:
    """NUTS in one compiled run, or with ``progress``: warm-up, then the draws in about five pieces,
    each reported with the draws done and the time left (in one piece when they are expected to be
    short: :data:`ONE_PIECE_BELOW_S`). Continuing from the last state draws
    exactly what one run draws (same keys, same adapted step size and mass matrix)."""
    release_compiled_programs_when_crowded()
    shapes = tuple((np.shape(leaf), str(getattr(leaf, "dtype", type(leaf).__name__)))
                   for leaf in jax.tree.leaves((model_args, init_params)))
    chunk = _draw_chunk(num_samples) if progress is not None else num_samples
    mcmc = _mcmc(model, num_chains, num_warmup, chunk, progress_bar, target_accept, dense_mass, shapes)
    extra_fields = ("diverging", "num_steps")
    # numpyro's own x64 and dtype handling sit under "standard" promotion.
    reuse = _sampling_loop_compiled_once() if _reuse_loops else contextlib.nullcontext()
    with jax.numpy_dtype_promotion("standard"), reuse:
        if progress is None:
            mcmc.run(jax.random.PRNGKey(seed), *model_args, init_params=init_params, extra_fields=extra_fields)
            pieces = [(mcmc.get_samples(group_by_chain=True), mcmc.get_extra_fields(group_by_chain=True))]
        else:
            pieces = _run_in_pieces(mcmc, model_args, init_params, seed, num_chains, num_warmup, num_samples,
                                    extra_fields, progress)
    grouped = {k: np.concatenate([np.asarray(p[0][k]) for p in pieces], axis=1) for k in pieces[0][0]}
    extra = {k: np.concatenate([np.asarray(p[1][k]) for p in pieces], axis=1) for k in extra_fields}
    samples = {k: v.reshape(-1, *v.shape[2:]) for k, v in grouped.items()}
    if not summarize:
        return PosteriorRun(samples, None, None)
    divergences = int(np.sum(extra["diverging"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = az.from_dict(posterior=grouped, sample_stats={"diverging": extra["diverging"],
                                                              "n_steps": extra["num_steps"]})
    return PosteriorRun(samples, idata, check_diagnostics(idata, divergences, var_names=var_names,
                                                          num_steps=extra["num_steps"],
                                                          max_tree_depth=MAX_TREE_DEPTH))


ONE_PIECE_BELOW_S = 10.0
"""Draws expected to take less than this many seconds (the warm-up's time per iteration, compilation
included, times the draws) run in one piece: each piece of parallel chains is traced and lowered again
by NumPyro (docs/benchmarks.md, `make fit`), a cost a short run would pay for reports it does not
need."""


def _run_in_pieces(mcmc, model_args, init_params, seed, num_chains, num_warmup, num_samples, extra_fields,
                   progress) -> list:
    chunk = mcmc.num_samples
    progress(f"warm-up: {num_chains} chains x {num_warmup} iterations")
    start = time.perf_counter()
    try:
        mcmc.warmup(jax.random.PRNGKey(seed), *model_args, init_params=init_params)
        # JAX dispatches asynchronously: without waiting, the warm-up's time would be reported as
        # the first piece of draws'.
        jax.block_until_ready(mcmc.post_warmup_state)
        warmup_s = time.perf_counter() - start
        progress(f"warm-up done in {warmup_s:.0f} s; draws 0/{num_samples} per chain")
        if warmup_s * num_samples / max(num_warmup, 1) < ONE_PIECE_BELOW_S:
            mcmc.num_samples = num_samples  # the cached object's own length is restored below
        piece = mcmc.num_samples
        start, pieces = time.perf_counter(), []
        for done in range(piece, num_samples + 1, piece):
            mcmc.run(mcmc.post_warmup_state.rng_key, *model_args, extra_fields=extra_fields)
            pieces.append((mcmc.get_samples(group_by_chain=True), mcmc.get_extra_fields(group_by_chain=True)))
            mcmc.post_warmup_state = mcmc.last_state
            jax.block_until_ready(pieces[-1])
            now = time.perf_counter()
            if done == piece:  # the first piece also compiles the sampling loop: time the others
                start, left = now, None
            else:
                left = (now - start) / (done - piece) * (num_samples - done)
            progress(f"draws {done}/{num_samples} per chain"
                     + (f", about {left:.0f} s left" if left is not None and done < num_samples else ""))
    finally:
        mcmc.post_warmup_state = None  # the cached sampler starts the next call from its own warm-up
        mcmc.num_samples = chunk
    return pieces


def prior_starts(model: Callable, model_args: tuple, num_chains: int, seed: int,
                 max_tries: int = 100) -> dict[str, jax.Array]:
    """One starting point per chain, each drawn from the prior (in NumPyro's unconstrained space).

    Dispersed starts are what lets split R-hat see chains that settle in different places
    (Vehtari et al. 2021); chains started together near one point, such as a point fit, agree
    by construction and flatter R-hat. A draw whose log density is not finite is drawn again
    (up to ``max_tries`` per chain). The prior draw runs eagerly: its few operations are compiled
    once per process and shape and shared by every model that uses them, which costs less over a
    run's several models than one compiled draw per model. The log density at the draw holds the
    likelihood, whose operations are many and model-specific (a truncated normal's normaliser alone
    is two ``log_ndtr``): it is compiled once per model and shape.

    Raises:
      ValueError: when ``model(*model_args)`` observes no site (the data were left out of
        ``model_args``: their sites would be latent, and a start would hold them).
    """
    key = jax.random.PRNGKey(seed + 7919)
    starts = []
    for chain in range(num_chains):
        for attempt in range(max_tries):
            start = _prior_draw(model, model_args, jax.random.fold_in(key, chain * max_tries + attempt))
            if start is not None:
                starts.append(start)
                break
        else:
            raise ValueError(f"no draw of the prior in {max_tries} has a finite log density on these data")
    if num_chains == 1:
        return starts[0]
    return {name: jnp.stack([start[name] for start in starts]) for name in starts[0]}


@functools.lru_cache(maxsize=64)
def _compiled_log_joint(model: Callable) -> Callable:
    """The joint log density of ``model`` at latent ``values``, compiled (see :func:`prior_starts`)."""
    return jax.jit(lambda model_args, values: log_density(model, model_args, {}, values)[0])


def _prior_draw(model: Callable, model_args: tuple, key: jax.Array) -> dict[str, jax.Array] | None:
    """One prior draw of the latent sites in unconstrained space, None when the joint log density there
    is not finite."""
    with jax.numpy_dtype_promotion("standard"):
        trace = numpyro.handlers.trace(numpyro.handlers.seed(model, key)).get_trace(*model_args)
        latent = {name: site for name, site in trace.items()
                  if site["type"] == "sample" and not site["is_observed"]}
        if not any(site["type"] == "sample" and site["is_observed"] for site in trace.values()):
            # Without its data a model's observation sites are latent: a start would hold them, and
            # NUTS would sample the data as parameters.
            raise ValueError(f"the model observes nothing with these arguments (its sample sites {sorted(latent)} "
                             "are all latent): pass the data to condition on")
        values = {name: site["value"] for name, site in latent.items()}
        log_joint = _compiled_log_joint(model)(model_args, values)
    if not np.isfinite(float(log_joint)):
        return None
    return {name: biject_to(site["fn"].support).inv(site["value"]) for name, site in latent.items()}
