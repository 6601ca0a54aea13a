"""Fit the SDSL laws from data and predict the optimal draft size N* with uncertainty.

    python -m experiments.fit                      # point fits on the shipped data
    python -m experiments.fit --posterior          # + NUTS posteriors and bands on N* (make fit)
    python -m experiments.fit --pretraining runs.csv --acceptance pairs.csv --posterior --out out/

Pipeline: (1) the loss law L(N, D) by the Epoch replication's multi-start Huber fit; (2) the
acceptance plane by weighted least squares when acceptance data are given, otherwise the paper's
plane SDSL2026 (and its influence on N* is shown as implicit-derivative elasticities); (3) N*(M)
for a grid of targets and the linear law N* ~ mu M + M0; with --posterior, (4) NUTS posteriors of
the loss law (and the plane), diagnostics, and bands on N*, M/N*, gamma*, T* and (mu, M0).

Outputs in --out: summary.json, loss_law_posterior.nc (and plane_posterior.nc), and figures
loss_law_fit.png, n_star_bands.png, throughput_curves.png (acceptance_plane.png when fitted).
Exit status: 0 on success, 2 for unusable input (the message names file, line and column),
3 with --strict when the posterior diagnostics fail.
"""

from __future__ import annotations

import os

# One CPU device per chain lets NUTS run its chains in parallel; must precede importing jax.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # the Huber fit and N* need float64

import numpy as np  # noqa: E402

from experiments import fit_figures  # noqa: E402
from experiments.runlog import Log, sha256, versions, write_json  # noqa: E402
from sdsl_jax import SDSL2026, SDSL2026_LINEAR_LAW, AcceptancePlane, LossLaw, bayes, solve_draft_size  # noqa: E402
from sdsl_jax.data import DataError, load_acceptance, load_pretraining  # noqa: E402
from sdsl_jax.fitting import EPOCH_GRID, fit_acceptance_plane, fit_loss_law, law_from_theta  # noqa: E402
from sdsl_jax.optimum import fit_linear_law  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = {
    "chinchilla": dict(pretraining=os.path.join(REPO, "fits", "data", "chinchilla_fig4.csv"), acceptance=None,
                       drop_highest_loss=5, m_min=1e10, m_max=1.1e11, targets=(13e9, 30e9, 70e9, 110e9),
                       d_draft=1e12, d_target=1e12),
    # Our ladder's scale: targets of 50k-2M parameters trained on ~1e6-1e7 bytes.
    "ladder": dict(pretraining=os.path.join(REPO, "fits", "ladder", "pretraining.csv"),
                   acceptance=os.path.join(REPO, "fits", "ladder", "acceptance.csv"), drop_highest_loss=0,
                   m_min=5e4, m_max=2e6, targets=(1.2e5, 2.6e5, 4.8e5, 1.2e6), d_draft=5e6, d_target=5e6),
}
PAPER_MU, PAPER_M0 = float(SDSL2026_LINEAR_LAW.mu), float(SDSL2026_LINEAR_LAW.m0)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.fit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=sorted(DATASETS), default="chinchilla",
                   help="shipped data to use: 'chinchilla' (Hoffmann et al. Fig. 4 runs; plane fixed at the "
                        "paper's) or 'ladder' (our trained models, fits/ladder/). Default: chinchilla")
    p.add_argument("--pretraining", metavar="PATH", help="pre-training runs CSV (schema sdsl-pretraining v1); "
                   "overrides the dataset's")
    p.add_argument("--acceptance", metavar="PATH", help="acceptance CSV (schema sdsl-acceptance v1); fits the "
                   "plane instead of using SDSL2026")
    p.add_argument("--drop-highest-loss", type=int, metavar="K", help="drop the K highest-loss runs before "
                   "fitting (default: 5 for the shipped Chinchilla data, as the Epoch replication does; else 0)")
    p.add_argument("--posterior", action="store_true", help="also sample NUTS posteriors and report bands")
    p.add_argument("--m-min", type=float, help="smallest target size of the N*(M) grid (chinchilla: 1e10; "
                   "ladder: 5e4)")
    p.add_argument("--m-max", type=float, help="largest target size of the N*(M) grid (chinchilla: 1.1e11; "
                   "ladder: 2e6)")
    p.add_argument("--num-targets", type=int, default=41, help="target sizes in the grid, linearly spaced (41)")
    p.add_argument("--targets", type=float, nargs="+", metavar="M",
                   help="named targets for the table (chinchilla: 13e9 30e9 70e9 110e9; ladder: 1.2e5 2.6e5 "
                   "4.8e5 1.2e6)")
    p.add_argument("--d-draft", type=float, help="draft training tokens D (chinchilla: 1e12; ladder: 5e6)")
    p.add_argument("--d-target", type=float, help="target training tokens D' (chinchilla: 1e12; ladder: 5e6)")
    p.add_argument("--chains", type=int, default=4, help="NUTS chains (4)")
    p.add_argument("--warmup", type=int, default=500, help="NUTS warm-up iterations per chain (500)")
    p.add_argument("--draws", type=int, default=500, help="NUTS draws per chain (500)")
    p.add_argument("--starts", type=int, metavar="K", help="use every K-th of the 4,500 Epoch starts "
                   "(default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (0)")
    p.add_argument("--out", default="out/fit", help="output folder (out/fit)")
    p.add_argument("--no-figures", action="store_true", help="skip the figures")
    p.add_argument("--strict", action="store_true", help="exit with status 3 when posterior diagnostics fail")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--resume", action="store_true", help="reuse the stages (point fit, posteriors) that an "
                   "earlier, interrupted run finished in --out with the same data and settings")
    return p.parse_args(argv)


class Stages:
    """Finished units of work in ``<out>/stages/``, each keyed by a fingerprint of its inputs.

    Written atomically when a unit ends; with ``--resume`` a unit whose fingerprint matches is
    loaded instead of recomputed, so an interruption loses at most the unit in flight.
    """

    def __init__(self, out: str, resume: bool, inputs: dict):
        self.dir, self.resume = os.path.join(out, "stages"), resume
        self.inputs = json.dumps(inputs, sort_keys=True)
        os.makedirs(self.dir, exist_ok=True)

    def _key(self, name: str) -> str:
        return hashlib.sha256(f"{name}|{self.inputs}".encode()).hexdigest()

    def load(self, name: str) -> dict | None:
        path = os.path.join(self.dir, name + ".npz")
        if not (self.resume and os.path.exists(path)):
            return None
        with np.load(path, allow_pickle=False) as data:
            if str(data["fingerprint"]) != self._key(name):
                return None
            return {k: data[k] for k in data.files if k != "fingerprint"}

    def save(self, name: str, **arrays) -> None:
        path = os.path.join(self.dir, name + ".npz")
        with open(path + ".tmp", "wb") as f:
            np.savez(f, fingerprint=self._key(name), **arrays)
        os.replace(path + ".tmp", path)


def sample_with_stage(stages, name, nc_path, sample):
    """Run ``sample()`` (a bayes.sample_* call) unless ``stages`` holds its finished result."""
    cached = stages.load(name)
    if cached is not None and os.path.exists(nc_path):
        samples = {k[2:]: v for k, v in cached.items() if k.startswith("s_")}
        diagnostics = bayes.Diagnostics(**json.loads(str(cached["diagnostics"])))
        return bayes.PosteriorRun(samples, bayes.az.from_netcdf(nc_path), diagnostics), True
    run = sample()
    bayes.save_inference_data(run.inference_data, nc_path)
    stages.save(name, diagnostics=json.dumps(run.diagnostics._asdict()), **{f"s_{k}": v for k, v in run.samples.items()})
    return run, False


def interval(draws, level=0.9):
    lo, med, hi = np.nanquantile(np.asarray(draws), [(1 - level) / 2, 0.5, (1 + level) / 2])
    return dict(median=float(med), lo90=float(lo), hi90=float(hi))


def run(args) -> int:
    log = Log(args.quiet)
    dataset = DATASETS[args.dataset]
    for name in ("m_min", "m_max", "targets", "d_draft", "d_target"):
        if getattr(args, name) is None:
            setattr(args, name, dataset[name])
    pre_path = args.pretraining or dataset["pretraining"]
    acc_path = args.acceptance or (dataset["acceptance"] if not args.pretraining else None)
    drop = args.drop_highest_loss if args.drop_highest_loss is not None else (
        dataset["drop_highest_loss"] if not args.pretraining else 0)
    if args.num_targets < 2 or not 0 < args.m_min < args.m_max:
        raise SystemExit("error: need --num-targets >= 2 and 0 < --m-min < --m-max")
    for name in ("d_draft", "d_target"):
        if not getattr(args, name) > 0:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be > 0")
    os.makedirs(args.out, exist_ok=True)

    runs = load_pretraining(pre_path)
    if drop:
        if drop >= len(runs) - 5:
            raise SystemExit(f"error: --drop-highest-loss {drop} leaves fewer than 6 runs")
        runs = runs.select(np.sort(np.argsort(runs.loss, kind="stable")[:-drop]))
    acceptance = load_acceptance(acc_path) if acc_path else None
    log(f"data: {len(runs)} pre-training runs from {os.path.relpath(pre_path)}"
        + (f" ({drop} highest-loss dropped)" if drop else "")
        + (f"; {len(acceptance)} acceptance pairs from {os.path.relpath(acc_path)}" if acceptance else
           "; no acceptance data: plane fixed at SDSL2026"))

    # (1) loss law, point fit.
    starts = EPOCH_GRID[:: args.starts] if args.starts else EPOCH_GRID

    last = [0.0]

    def progress(rnd, active, total):
        now = time.perf_counter()
        if now - last[0] > 2.0 or not active:  # a line every 2 s is enough to see it moving
            last[0] = now
            log(f"loss law: L-BFGS round {rnd}, {active}/{total} starts still running")

    stages = Stages(args.out, args.resume, dict(
        pretraining=sha256(pre_path), acceptance=sha256(acc_path) if acc_path else None, drop=drop,
        starts=args.starts, chains=args.chains, warmup=args.warmup, draws=args.draws, seed=args.seed))
    point = stages.load("point_fit")
    if point is None:
        fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, starts=starts, progress=progress)
        point = dict(theta=np.asarray(fit.theta), value=np.asarray(fit.result.value),
                     converged=np.asarray(fit.result.converged))
        stages.save("point_fit", **point)
    else:
        log("loss law: point fit reused from an earlier run (--resume)")
    law = LossLaw(*(float(v) for v in law_from_theta(point["theta"])))
    fit_value, fit_converged = float(point["value"]), bool(point["converged"])
    log("loss law: E={:.4f} A={:.2f} B={:.2f} alpha={:.4f} beta={:.4f} (objective {:.6g}, {})".format(
        *(float(v) for v in law), fit_value, "converged" if fit_converged else "NOT converged"))

    # (2) plane.
    if acceptance is not None:
        plane_fit = fit_acceptance_plane(acceptance.ppl_draft, acceptance.ppl_target, acceptance.alpha,
                                         weights=acceptance.regression_weights())
        plane = AcceptancePlane(*(float(v) for v in plane_fit.plane))
        plane_info = dict(source="fitted (weighted least squares)", r_squared=float(plane_fit.r_squared))
        log(f"plane: A={plane.A:.5f} B={plane.B:.5f} C={plane.C:.4f} R^2={float(plane_fit.r_squared):.3f}")
    else:
        plane = SDSL2026
        plane_info = dict(source="SDSL2026 (paper's values, fixed: no acceptance data)")

    # (3) N*(M).
    m_grid = np.linspace(args.m_min, args.m_max, args.num_targets)
    named = np.asarray(args.targets, np.float64)
    kw = dict(d_draft=args.d_draft, d_target=args.d_target)
    grid_sol = solve_draft_size(m_grid, loss=law, plane=plane, **kw)
    named_sol = solve_draft_size(named, loss=law, plane=plane, **kw)
    line = fit_linear_law(m_grid, grid_sol.n_star) if np.isfinite(grid_sol.n_star).sum() >= 2 else None
    failed = int(np.sum(np.asarray(grid_sol.status) != 0))
    log(f"N*: solved {len(m_grid) - failed}/{len(m_grid)} grid targets"
        + (f"; mu={float(line.mu):.4e} M0={float(line.m0):.4e}" if line else ""))

    summary = dict(
        command="python -m experiments.fit " + " ".join(args.argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        seed=args.seed, versions=versions(),
        data=dict(pretraining=dict(path=os.path.relpath(pre_path), sha256=sha256(pre_path), runs_used=len(runs),
                                   dropped_highest_loss=drop),
                  acceptance=dict(path=os.path.relpath(acc_path), sha256=sha256(acc_path), pairs=len(acceptance))
                  if acceptance else None),
        settings=dict(d_draft=args.d_draft, d_target=args.d_target, m_grid=[float(args.m_min), float(args.m_max),
                      args.num_targets], starts=len(starts), chains=args.chains, warmup=args.warmup,
                      draws=args.draws),
        loss_law=dict(E=float(law.E), A=float(law.A), B=float(law.B), alpha=float(law.alpha), beta=float(law.beta),
                      objective=fit_value, converged=fit_converged),
        plane=dict(A=float(plane.A), B=float(plane.B), C=float(plane.C), **plane_info),
        linear_law=dict(mu=float(line.mu), m0=float(line.m0)) if line else None,
        paper=dict(mu=PAPER_MU, m0=PAPER_M0),
        targets=[dict(m_target=float(m), n_star=float(named_sol.n_star[i]), gamma_star=float(named_sol.gamma_star[i]),
                      alpha=float(named_sol.alpha[i]), m_over_n_star=float(m / named_sol.n_star[i]),
                      tokens_per_flop=float(named_sol.throughput[i]), status=int(named_sol.status[i]))
                 for i, m in enumerate(named)],
        grid=dict(m_target=m_grid.tolist(), n_star=np.asarray(grid_sol.n_star).tolist(),
                  gamma_star=np.asarray(grid_sol.gamma_star).tolist()),
    )

    bands = None
    strict_failure = False
    if args.posterior:
        log(f"posterior: NUTS on the loss law, {args.chains} chains x ({args.warmup} warm-up + {args.draws} draws)")
        post, reused = sample_with_stage(
            stages, "loss_law_posterior", os.path.join(args.out, "loss_law_posterior.nc"),
            lambda: bayes.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, init=law, num_chains=args.chains,
                                          num_warmup=args.warmup, num_samples=args.draws, seed=args.seed,
                                          progress_bar=not args.quiet))
        if reused:
            log("posterior: loss-law draws reused from an earlier run (--resume)")
        diagnostics = {"loss_law": post.diagnostics._asdict()}
        laws = bayes.laws_from_posterior(post.samples)
        planes = plane
        if acceptance is not None:
            log("posterior: NUTS on the acceptance plane")
            plane_post, _ = sample_with_stage(
                stages, "plane_posterior", os.path.join(args.out, "plane_posterior.nc"),
                lambda: bayes.sample_plane(acceptance.ppl_draft, acceptance.ppl_target, acceptance.alpha,
                                           weights=acceptance.regression_weights(), num_chains=args.chains,
                                           num_warmup=args.warmup, num_samples=args.draws, seed=args.seed + 1,
                                           progress_bar=not args.quiet))
            diagnostics["plane"] = plane_post.diagnostics._asdict()
            planes = bayes.planes_from_posterior(plane_post.samples)
            # Pair each loss-law draw with a plane draw (independent posteriors).
            n = min(len(laws.E), len(planes.A))
            laws = type(laws)(*(v[:n] for v in laws))
            planes = type(planes)(*(v[:n] for v in planes))
        for name, diag in diagnostics.items():
            if diag["ok"]:
                log(f"diagnostics ({name}): OK (max R-hat {diag['max_rhat']:.3f}, min bulk ESS "
                    f"{diag['min_ess_bulk']:.0f}, {diag['num_divergences']} divergences)")
            else:
                strict_failure = True
                banner = "!" * 78
                log(f"{banner}\nWARNING: {name} posterior failed its diagnostics: {'; '.join(diag['problems'])}.\n"
                    f"Do not trust its bands; run longer (--warmup/--draws) or more chains.\n{banner}")

        log("propagating posterior draws to N*(M)")
        bands = bayes.propagate_draft_size(m_grid, laws, planes, **kw,
                                           progress=lambda d, t: log(f"  {d}/{t} draws solved"))
        named_bands = bayes.propagate_draft_size(named, laws, planes, **kw)
        q = list(bands.quantiles)
        i05, i50, i95 = q.index(0.05), q.index(0.5), q.index(0.95)
        for j, target in enumerate(summary["targets"]):
            nb = named_bands
            target.update(n_star_median=float(nb.n_star[i50, j]), n_star_lo90=float(nb.n_star[i05, j]),
                          n_star_hi90=float(nb.n_star[i95, j]),
                          m_over_n_star_lo90=float(nb.m_over_n[i05, j]),
                          m_over_n_star_hi90=float(nb.m_over_n[i95, j]),
                          gamma_star_lo90=float(nb.gamma_star[i05, j]),
                          gamma_star_hi90=float(nb.gamma_star[i95, j]),
                          failed_fraction=float(nb.failed_fraction[j]))
        summary["posterior"] = dict(
            diagnostics=diagnostics,
            loss_law={k: interval(v) for k, v in laws._asdict().items()},
            plane={k: interval(v) for k, v in planes._asdict().items()} if acceptance is not None else "fixed",
            linear_law=dict(mu=interval(bands.linear_law.mu), m0=interval(bands.linear_law.m0)),
            bands=dict(quantiles=q, m_target=m_grid.tolist(), n_star=bands.n_star.tolist(),
                       m_over_n_star=bands.m_over_n.tolist(), gamma_star=bands.gamma_star.tolist(),
                       tokens_per_flop=bands.throughput.tolist(), failed_fraction=bands.failed_fraction.tolist()),
        )
    if acceptance is None:
        sens = bayes.plane_sensitivity(named, law=law, plane=plane, **kw)
        summary["plane_sensitivity"] = dict(
            meaning="elasticity d log N* / d log |theta| at the point fit, by implicit derivatives",
            m_target=named.tolist(), **{k: v.tolist() for k, v in sens.items()})

    write_json(os.path.join(args.out, "summary.json"), summary)
    if not args.no_figures:
        made = fit_figures.make_all(args.out, runs=runs, law=law, plane=plane, acceptance=acceptance,
                                    grid=(m_grid, np.asarray(grid_sol.n_star)), bands=bands, line=line, **kw)
        log("figures: " + ", ".join(os.path.relpath(p) for p in made))
    print_table(summary, args)
    log(f"wrote {os.path.relpath(os.path.join(args.out, 'summary.json'))}")
    return 3 if (args.strict and strict_failure) else 0


def size(n: float) -> str:
    """A parameter count with a readable unit: 293.6M, 70B, 35.3k."""
    if not np.isfinite(n):
        return "nan"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}" if unit != "M" or abs(n) < 1e8 else f"{n / scale:.1f}{unit}"
    return f"{n:.3g}"


def print_table(summary, args) -> None:
    if args.quiet:
        return
    post = summary.get("posterior")
    law = summary["loss_law"]
    print("\nLoss law (point fit" + (", posterior median [90% interval]" if post else "") + "):")
    for k in ("E", "A", "B", "alpha", "beta"):
        extra = ""
        if post:
            i = post["loss_law"][k]
            extra = f"   {i['median']:.4g} [{i['lo90']:.4g}, {i['hi90']:.4g}]"
        print(f"  {k:>5} = {law[k]:<10.5g}{extra}")
    p = summary["plane"]
    print(f"Acceptance plane: A={p['A']:.5g} B={p['B']:.5g} C={p['C']:.5g}  ({p['source']})")
    print("\n  target M |     N* (point) |  N* median [90% band]         |  M/N* | gamma* | alpha")
    for t in summary["targets"]:
        band = (f"{size(t['n_star_median']):>8} [{size(t['n_star_lo90'])}, {size(t['n_star_hi90'])}]"
                if "n_star_median" in t else "(run with --posterior)")
        print(f"  {size(t['m_target']):>8} | {size(t['n_star']):>14} | {band:<29} | {t['m_over_n_star']:5.0f} | "
              f"{t['gamma_star']:6.2f} | {t['alpha']:.4f}")
    ll = summary["linear_law"]
    if ll:
        txt = f"\nLinear law N* = mu M + M0: mu = {ll['mu']:.4g}, M0 = {ll['m0']:.4g}"
        if post:
            mu, m0 = post["linear_law"]["mu"], post["linear_law"]["m0"]
            txt += (f"   posterior mu {mu['median']:.4g} [{mu['lo90']:.4g}, {mu['hi90']:.4g}], "
                    f"M0 {m0['median']:.4g} [{m0['lo90']:.4g}, {m0['hi90']:.4g}]")
        print(txt + f"   (paper: mu = {PAPER_MU}, M0 = {PAPER_M0:.3g})")
    if "plane_sensitivity" in summary:
        s = summary["plane_sensitivity"]
        print("Sensitivity of N* to the fixed plane (d log N* / d log |coef|): " + ", ".join(
            f"{k} {np.mean(s[k]):+.2f}" for k in ("A", "B", "C")))
    print()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv
    try:
        return run(args)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
