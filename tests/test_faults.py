"""Faults injected into every command: bad arguments, contradictory measurements, damaged stages,
full and read-only disks, Ctrl-C inside a compiled loop, a closed stdout.

The contract (experiments/runlog.py): exit 2 with one ``error:`` line naming the argument, file,
line and column or output path, no traceback, nothing left in ``--out``; a damaged stage is
discarded with one line and recomputed to the same answer; Ctrl-C ends within seconds with 130.
"""

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments import calibration, closure, fit, holdout, leviathan, reproduce_paper, wallclock
from sdsl_jax.data import DataError, load_speculative

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
LADDER = os.path.join(ROOT, "fits", "ladder-v1")
ENV = dict(os.environ, SDSL_JAX_COMPILE_CACHE="off", PYTHONUNBUFFERED="1")
# A small fit: 45 of the 4,500 Epoch starts, one short chain; enough to make every stage.
SMALL = ["--starts", "100", "--no-figures", "--quiet"]
POSTERIOR = ["--posterior", "--chains", "1", "--warmup", "40", "--draws", "40", "--reruns", "0"]


def _ladder_copy(tmp_path, edit=None):
    """The ladder's CSVs in ``tmp_path/data``; ``edit(name, rows)`` may change the rows of a file."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("pretraining.csv", "acceptance.csv", "speculative.csv", "latency.csv"):
        with open(os.path.join(LADDER, name), newline="") as f:
            rows = list(csv.DictReader(f))
        if edit is not None:
            rows = edit(name, rows) or rows
        with open(data / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return data


def _refused(capsys, fragment, out=None):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert fragment in err, err
    assert err.strip().splitlines()[-1].startswith("error: ")
    if out is not None:
        assert not os.path.exists(out), "a refused run must leave nothing"
    return err


# --- cross-checked measurements -------------------------------------------------------------------

def _speculative_with(tmp_path, **changes):
    with open(os.path.join(LADDER, "speculative.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    rows[0].update(changes)  # the first row: gamma 1, 1273 iterations, histogram 482;791
    path = tmp_path / "speculative.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("changes, column, fragment", [
    (dict(alpha_mle="0.95"), "alpha_mle", "contradicts the histogram's MLE 0.6214"),
    (dict(tau="7.5"), "tau", "outside [1, gamma + 1]"),
    (dict(tau="1.9"), "tau", "contradicts 1 + accepted / iterations"),
    (dict(histogram="1273"), "histogram", "has 1 counts; gamma = 1 needs gamma + 1 = 2"),
    (dict(histogram="900;791"), "histogram", "adds up to 1691 iterations"),
    (dict(histogram="483;790"), "histogram", "accepts 790 tokens in all"),
    (dict(accepted="5000", accepted_per_prompt="", iterations_per_prompt=""), "accepted", "exceeds gamma x iterations"),
    (dict(histogram="", alpha_mle="0.99"), "alpha_mle", "contradicts the MLE's range"),
    (dict(accepted_over_drafted="0.2"), "accepted_over_drafted", "contradicts accepted / (gamma x iterations)"),
])
def test_speculative_measurements_are_cross_checked(tmp_path, changes, column, fragment):
    path = _speculative_with(tmp_path, **changes)
    with pytest.raises(DataError) as info:
        load_speculative(path)
    assert info.value.line == 2 and info.value.column == column and fragment in str(info.value)


def test_the_committed_speculative_runs_pass_the_cross_checks():
    assert len(load_speculative(os.path.join(LADDER, "speculative.csv"))) > 0


@pytest.mark.parametrize("command", ["closure", "wallclock"])
def test_commands_refuse_contradictory_speculative_runs(command, tmp_path, capsys):
    def edit(name, rows):
        if name == "speculative.csv":
            rows[0]["alpha_mle"] = "0.95"

    data = _ladder_copy(tmp_path, edit)
    out = tmp_path / "out"
    cli = {"closure": closure, "wallclock": wallclock}[command]
    assert cli.main(["--data", str(data), "--out", str(out), "--quiet"]) == 2
    _refused(capsys, "speculative.csv:2: column 'alpha_mle'", out)


def test_closure_names_a_draft_missing_from_the_acceptance_pairs(tmp_path, capsys):
    def edit(name, rows):
        if name == "speculative.csv":
            rows[3]["draft"] = "L9@1"

    data = _ladder_copy(tmp_path, edit)
    out = tmp_path / "out"
    assert closure.main(["--data", str(data), "--out", str(out), "--quiet"]) == 2
    _refused(capsys, "speculative.csv:5: column 'draft': 'L9@1' is in no row of", out)


def test_wallclock_names_the_latency_file_it_cannot_fit(tmp_path, capsys):
    def edit(name, rows):
        if name == "latency.csv":
            return [r for r in rows if r["model"] == "L1"]

    data = _ladder_copy(tmp_path, edit)
    out = tmp_path / "out"
    assert wallclock.main(["--data", str(data), "--out", str(out), "--quiet"]) == 2
    _refused(capsys, "latency.csv", out)


# --- arguments of every command ---------------------------------------------------------------------

@pytest.mark.parametrize("cli, args, fragment", [
    (closure, ["--starts", "0"], "--starts must be at least 1"),
    (closure, ["--chains", "0"], "--chains must be at least 1"),
    (closure, ["--propagate", "0"], "--propagate must be at least 1"),
    (closure, ["--draws", "-2"], "--draws must be at least 1"),
    (holdout, ["--chains", "0"], "--chains must be at least 1"),
    (holdout, ["--starts", "0"], "--starts must be at least 1"),
    (holdout, ["--draws", "0"], "--draws must be at least 1"),
    (holdout, ["--laws", "cubic"], "unknown law or acceptance model: cubic"),
    (wallclock, ["--draws", "0"], "--draws must be at least 1"),
    (wallclock, ["--draws", "-3"], "--draws must be at least 1"),
    (wallclock, ["--form", "cubic"], "--form 'cubic'"),
])
def test_bad_arguments_exit_2_before_anything_is_made(cli, args, fragment, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["--data", LADDER, "--out", str(out), "--quiet", *args]) == 2
    _refused(capsys, fragment, out)


@pytest.mark.parametrize("datasets", ["0", "-5"])
def test_calibration_refuses_a_non_positive_number_of_datasets(datasets, tmp_path, capsys):
    out = tmp_path / "out"
    assert calibration.main(["--datasets", datasets, "--out", str(out)]) == 2
    _refused(capsys, f"--datasets must be at least 1, got {datasets}", out)


def test_reproduce_paper_says_why_no_line_can_be_fitted(capsys):
    assert reproduce_paper.main(["--tokens", "1e3"]) == 2
    _refused(capsys, "N* is solved for 0 of 101 targets")


def test_leviathan_has_arguments_and_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        leviathan.main(["--help"])
    assert info.value.code == 0 and "--table" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        leviathan.main(["--bogus"])
    assert info.value.code == 2
    assert leviathan.main(["--table", str(tmp_path / "missing.csv")]) == 2
    _refused(capsys, "missing.csv cannot be read")
    (tmp_path / "bad.csv").write_text("task,alpha\nx,0.5\n")
    assert leviathan.main(["--table", str(tmp_path / "bad.csv")]) == 2
    _refused(capsys, "bad.csv:2: not a row of Leviathan")


def test_holdout_without_acceptance_data_says_the_study_was_skipped(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    n, d = (v.ravel() for v in np.meshgrid(np.geomspace(5e7, 5e9, 3), np.geomspace(2e10, 4e11, 4)))
    loss = (1.7 + 410.0 / d ** 0.28) * np.exp(0.03 * rng.standard_normal(n.size))  # the data law E + B / D^beta
    (data / "pretraining.csv").write_text("n_params,n_tokens,loss\n" + "".join(
        f"{float(a)!r},{float(b)!r},{float(c)!r}\n" for a, b, c in zip(n, d, loss)))
    out = tmp_path / "out"
    assert holdout.main(["--data", str(data), "--out", str(out), "--laws", "data", "--chains", "1", "--warmup", "20",
                         "--draws", "20", "--starts", "3", "--quiet"]) == 0
    record = json.loads((out / "holdout.json").read_text())
    assert "acceptance.csv does not exist" in record["skipped"]["acceptance_models"]
    assert "Skipped:" in (out / "holdout.md").read_text()
    assert "acceptance models were not studied" in capsys.readouterr().err


# --- resume keyed on content, damaged stages --------------------------------------------------------

@pytest.fixture(scope="module")
def posterior_run(tmp_path_factory):
    """One small fit with a posterior, its folder kept as the undamaged reference."""
    out = tmp_path_factory.mktemp("fit") / "out"
    assert fit.main([*SMALL, *POSTERIOR, "--out", str(out)]) == 0
    return out


def _n_star(out):
    summary = json.loads((out / "summary.json").read_text())
    return [t["n_star_median"] for t in summary["targets"]], [t["n_star"] for t in summary["targets"]]


def _damage_truncate(path):
    with open(path, "r+b") as f:
        f.truncate(max(1, os.path.getsize(path) // 3))


def _damage_garble(path):
    with open(path, "wb") as f:  # an object array: refused, never unpickled
        np.savez(f, fingerprint=np.array([object()], dtype=object))


@pytest.mark.parametrize("target, damage", [("stages/point_fit.npz", _damage_truncate),
                                            ("stages/loss_law_posterior.npz", _damage_garble),
                                            ("loss_law_posterior.nc", _damage_truncate)])
def test_a_damaged_stage_is_discarded_with_one_line_and_refitted(posterior_run, target, damage, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(posterior_run, out)
    damage(out / target)
    capsys.readouterr()
    assert fit.main([*SMALL, *POSTERIOR, "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    stage = os.path.splitext(os.path.basename(target))[0]
    assert f"stage {stage}: stored copy unreadable" in err and "discarded, recomputing" in err
    assert "Traceback" not in err
    assert _n_star(out) == _n_star(posterior_run)  # same seed, same draws: the same answer


def test_a_stages_path_that_is_a_file_exits_2(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stages").write_text("not a folder")
    assert fit.main([*SMALL, "--out", str(out), "--resume"]) == 2
    _refused(capsys, "stages exists and is not a folder")


def _feed_fifo(path, text):
    """A writer thread for the named pipe ``path``: the command reads it as it would read stdin."""
    import threading

    def write():
        with open(path, "w") as f:
            f.write(text)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_resume_is_keyed_on_the_bytes_parsed_not_the_path(tmp_path, capsys):
    """A run on other data fed through the same path (a pipe) must not reuse the first run's fit."""
    import hashlib

    out, pipe = tmp_path / "out", tmp_path / "runs.pipe"
    os.mkfifo(pipe)
    with open(os.path.join(ROOT, "fits", "data", "chinchilla_fig4.csv")) as f:
        original = f.read()
    reader = csv.DictReader(io.StringIO(original))
    scaled = io.StringIO()
    writer = csv.DictWriter(scaled, fieldnames=reader.fieldnames)
    writer.writeheader()
    for row in reader:  # the same runs, each a hundred times larger: another law
        writer.writerow(dict(row, n_params=repr(float(row["n_params"]) * 100)))
    args = ["--starts", "100", "--no-figures", "--pretraining", str(pipe), "--out", str(out), "--targets", "13e9",
            "--d-draft", "1e12", "--d-target", "1e12"]
    medians = []
    for text, resume in ((original, []), (scaled.getvalue(), ["--resume"])):
        thread = _feed_fifo(pipe, text)
        assert fit.main([*args, *resume]) == 0
        thread.join()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["data"]["pretraining"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
        medians.append(summary["loss_law"]["A"])
    assert "point fit reused" not in capsys.readouterr().out
    assert medians[0] != medians[1]


def test_closure_stages_are_keyed_on_labels_and_weights():
    from sdsl_jax.data import load_acceptance, load_pretraining
    from sdsl_jax.store import content_digest

    runs = load_pretraining(os.path.join(LADDER, "pretraining.csv"))
    pairs = load_acceptance(os.path.join(LADDER, "acceptance.csv"))
    base = content_digest(runs, pairs)
    relabelled = runs.select(np.arange(len(runs)))
    object.__setattr__(relabelled, "run", ("a",) * len(runs))
    reweighted = pairs.select(np.arange(len(pairs)))
    object.__setattr__(reweighted, "weight", np.full(len(pairs), 2.0))
    renamed = pairs.select(np.arange(len(pairs)))
    object.__setattr__(renamed, "draft", tuple("x" + d for d in pairs.draft))
    digests = {base, content_digest(relabelled, pairs), content_digest(runs, reweighted),
               content_digest(runs, renamed)}
    assert len(digests) == 4
    assert content_digest(runs.select(np.arange(len(runs))), pairs) == base  # the same content: the same key


# --- writes: full and read-only disks, the optional compilation cache ----------------------------------

@pytest.fixture
def tiny_filesystem(tmp_path):
    """A mount point factory: ``mount(size, read_only)`` gives a fresh tmpfs (skips where not allowed)."""
    mounted = []

    def mount(size="8k", read_only=False):
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip("this machine does not allow mounting a small file system")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], capture_output=True)


def test_a_full_disk_is_exit_2_naming_the_path_and_leaves_nothing_partial(tiny_filesystem, capsys):
    disk = tiny_filesystem("8k")  # two pages: the point-fit stage fits, summary.json does not
    (disk / "summary.json").write_text("previous")
    assert fit.main([*SMALL, "--out", str(disk)]) == 2
    _refused(capsys, f"cannot write {disk / 'summary.json'}: No space left on device")
    assert (disk / "summary.json").read_text() == "previous"  # the earlier result survives
    left = sorted(p.name for p in disk.rglob("*"))
    assert left == ["point_fit.npz", "stages", "summary.json"], left  # no temporary file


def test_a_read_only_out_is_exit_2_naming_the_path(tiny_filesystem, capsys):
    disk = tiny_filesystem(read_only=True)
    assert fit.main([*SMALL, "--out", str(disk / "out")]) == 2
    _refused(capsys, f"cannot write {disk / 'out'}: Read-only file system")


@pytest.mark.parametrize("kind", ["read-only", "a file"])
def test_an_unusable_compile_cache_falls_back_to_off_with_one_warning(kind, tiny_filesystem, tmp_path, capsys):
    import jax

    from experiments.runlog import configure_jax

    if kind == "read-only":
        cache = tiny_filesystem(read_only=True) / "cache"
    else:
        cache = tmp_path / "cache"
        cache.write_text("not a folder")
    before = jax.config.jax_compilation_cache_dir
    configure_jax(compile_cache=str(cache))  # the CLIs' set-up: must not raise
    err = capsys.readouterr().err
    assert err.count("warning: compilation cache") == 1 and "Traceback" not in err
    assert jax.config.jax_compilation_cache_dir == before  # left off, not pointed at the bad path


# --- signals and pipes --------------------------------------------------------------------------

def test_ctrl_c_caught_where_python_cannot_raise_it_prints_no_traceback(monkeypatch):
    """Ctrl-C can land in a callback whose exception Python cannot propagate (JAX's garbage-collection
    callback, while the main thread waits on a compiled call): Python hands it to
    ``sys.unraisablehook``, which prints "Exception ignored" and a traceback. While the interrupt
    watcher runs (it ends the command), KeyboardInterrupt is not handed on; other such exceptions are,
    and the hook is restored when the watcher stops."""
    from experiments.runlog import _InterruptWatcher

    class RaisesWhenCollected:
        def __init__(self, error):
            self.error = error

        def __del__(self):
            raise self.error

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_type))
    watcher = _InterruptWatcher("nothing")
    try:
        RaisesWhenCollected(KeyboardInterrupt())
        RaisesWhenCollected(ValueError("reported"))
    finally:
        watcher.stop()
    assert reported == [ValueError]
    RaisesWhenCollected(KeyboardInterrupt())  # the watcher stopped: handed on again
    assert reported == [ValueError, KeyboardInterrupt]


def test_ctrl_c_inside_nuts_ends_within_seconds_and_keeps_the_finished_stages(tmp_path):
    out = tmp_path / "out"
    # Long chains: without the interrupt watcher Ctrl-C would wait for the compiled loop to return.
    # As from a terminal: a runner started in the background of a shell without job control (as CI may
    # be) passes SIGINT on ignored, and an ignored signal is never delivered; the command gets Python's
    # own handler back first (no preexec_fn: forking a threaded test process is unsafe).
    argv = ["experiments.fit", "--starts", "100", "--no-figures", "--posterior", "--chains", "1", "--warmup", "20000",
            "--draws", "20000", "--out", str(out)]
    launcher = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                f"sys.argv = {argv!r}; runpy.run_module('experiments.fit', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", launcher], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if "posterior: NUTS" in line:
                break
        time.sleep(3.0)  # inside the compiled sampling loop by now
        start = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        seconds = time.perf_counter() - start
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert seconds < 10, seconds
    assert "interrupted: finished stages are kept in" in err and "Traceback" not in err
    assert (out / "stages" / "point_fit.npz").exists()  # --resume reuses it
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_a_closed_stdout_ends_quietly(tmp_path):
    run = subprocess.run(f"{sys.executable} -m experiments.fit {' '.join(SMALL[:-1])} --out {tmp_path / 'out'} | head -1",
                         shell=True, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.stdout.count("\n") == 1
    assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr


def test_a_stage_line_cut_by_a_kill_is_skipped_with_one_warning_and_recomputed(tmp_path):
    from experiments.runlog import append_stage_line, read_stage_lines

    path = tmp_path / "stages.jsonl"
    append_stage_line(str(path), {"model": "a", "rows": [1, 2]})
    append_stage_line(str(path), {"model": "b", "rows": [3]})
    with open(path, "a") as f:
        f.write('{"model": "c", "ro')  # the unit in flight when the run was killed
    warnings = []
    assert read_stage_lines(str(path), warnings.append) == [{"model": "a", "rows": [1, 2]}, {"model": "b", "rows": [3]}]
    assert len(warnings) == 1 and "stages.jsonl:3: an unfinished stage line" in warnings[0]
    assert read_stage_lines(str(tmp_path / "missing.jsonl")) == []


def test_a_stages_path_that_is_a_file_is_exit_2_for_the_measuring_commands(tmp_path, capsys):
    from experiments import latency

    out = tmp_path / "out"
    out.mkdir()
    (out / "stages").write_text("not a folder")
    assert latency.main(["--preset", "micro", "--no-loops", "--cache-length", "8", "--out", str(out), "--quiet"]) == 2
    _refused(capsys, "stages")


def test_a_silent_step_gets_a_heartbeat_that_quotes_the_last_line_and_the_time_since(capsys):
    """A step that prints nothing for longer than the heartbeat's interval is not silent: a line
    says the work goes on, for how long since the last line, and quotes that line."""
    from experiments.runlog import Log

    log = Log()
    with log.heartbeat(0.3):
        log("stacking by size: kaplan without size(s) 46464: held-out log density 8.10")
        time.sleep(1.0)
    lines = capsys.readouterr().out.splitlines()
    beats = [line for line in lines if "... still working" in line]
    assert beats and all(line.endswith("s after: stacking by size: kaplan without size(s) 46464: held-out log "
                                       "density 8.10") for line in beats)
    quiet = Log(quiet=True)
    with quiet.heartbeat(0.1):
        time.sleep(0.3)
    assert "still working" not in capsys.readouterr().out
