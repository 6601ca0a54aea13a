"""What every command shares: its contract (:func:`run_command`), timestamped progress, provenance
(versions, hashes), atomic outputs and the process-wide JAX settings.

The contract of every ``python -m experiments.<name>``: exit 0 on success; exit 2 with one
``error: ...`` line naming the argument, file, line and column, or output path, for bad input, bad
arguments, damaged state or a failed write, and no traceback; exit 130 within a few seconds of
Ctrl-C, even inside one long compiled call, keeping every finished stage; a closed stdout
(``... | head``) ends quietly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import signal
import socket
import sys
import tempfile
import threading
import time
from importlib import metadata
from typing import Callable

from sdsl_jax.data import DataError
from sdsl_jax.store import StoreError, WriteError, remove_partial_writes, write_text


class UsageError(Exception):
    """An unusable argument: reported as ``error: ...`` with exit status 2, like a bad CSV."""


class Log:
    """``log(msg)`` prints ``[elapsed] msg`` unless quiet.

    ``with log.heartbeat(10):`` keeps a long step from looking hung: whenever nothing has been
    printed for ``seconds``, a line says which step is still running and for how long (from a
    daemon thread, so it also speaks during one long compiled call such as NUTS).
    """

    def __init__(self, quiet: bool = False):
        self.quiet, self.t0 = quiet, time.perf_counter()
        self._last_time, self._last_msg, self._step_start = self.t0, "", self.t0
        self._lock = threading.Lock()

    def __call__(self, msg: str, end: str = "\n") -> None:
        with self._lock:
            now = time.perf_counter()
            if not msg.startswith("  ... "):  # a new step (heartbeat lines continue the current one)
                self._last_msg, self._step_start = msg, now
            self._last_time = now
            if not self.quiet:
                try:
                    print(f"[{now - self.t0:6.1f}s] {msg}", end=end, flush=True)
                except BrokenPipeError:
                    self.quiet = True  # stdout closed (`| head`): the main thread ends the command
                    if threading.current_thread() is threading.main_thread():
                        raise

    def warning(self, msg: str) -> None:
        """``WARNING: msg`` on stderr, also with ``quiet`` (something the user must know)."""
        with self._lock:
            print(f"[{time.perf_counter() - self.t0:6.1f}s] WARNING: {msg}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def heartbeat(self, seconds: float = 10.0):
        if self.quiet:
            yield
            return
        stop = threading.Event()

        def beat():
            while not stop.wait(0.25):
                with self._lock:
                    now = time.perf_counter()
                    silent, step, running = now - self._last_time, self._last_msg, now - self._step_start
                if silent >= seconds:
                    self(f"  ... still working ({running:.0f} s on this step): {_shorten(step)}")

        thread = threading.Thread(target=beat, name="sdsl-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _shorten(text: str, width: int = 150) -> str:
    text = text.strip().splitlines()[0] if text.strip() else "(starting)"
    return text if len(text) <= width else text[: width - 3] + "..."


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_header(prog: str, argv: list[str] | None) -> dict:
    """What every result file records of the run that made it: the command line, the UTC date and
    the package versions (``argv`` None: the process's own arguments)."""
    import datetime

    return dict(command=f"python -m {prog} " + " ".join(argv if argv is not None else sys.argv[1:]),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), versions=versions())


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
    """Write ``obj`` as JSON atomically (:func:`sdsl_jax.store.atomic_write`).

    ``strict=True`` writes standard JSON: NaN and infinities become null (each summary records the
    status that says why a value is missing).
    """
    if strict:
        obj = _finite_or_none(obj)
    text = json.dumps(obj, indent=2, allow_nan=not strict) + "\n"
    write_text(path, text)


def check_arguments(args, *, at_least_one: tuple[str, ...] = (), out: str | None = None) -> None:
    """The checks every command makes before any work: each named count at least 1, and an ``--out``
    that is a folder or does not exist yet (UsageError naming the flag)."""
    for name in at_least_one:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if out and os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} exists and is not a folder")


def read_stage_lines(path: str, warn: Callable[[str], None] | None = None) -> list[dict]:
    """The finished units of a JSON-lines stage file (one unit a line, appended as each ends).

    A line that does not parse is the unit that was being written when a run was killed: it is
    skipped, with one warning, and recomputed. A missing file holds no units.
    """
    if not os.path.exists(path):
        return []
    units = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                units.append(json.loads(line))
            except json.JSONDecodeError:
                if warn is not None:
                    warn(f"{path}:{number}: an unfinished stage line (a run killed while writing it); recomputing it")
    return units


def append_stage_line(path: str, unit: dict) -> None:
    """Append one finished unit to a JSON-lines stage file, flushed to disk before returning."""
    line = json.dumps(unit) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise WriteError(path, err.strerror or str(err)) from None


def make_output_folder(path: str, flag: str = "--out") -> str:
    """Create the output folder ``path`` and prove it writable; :class:`WriteError` naming it otherwise.

    Called after every argument and input has been checked, so that a refused run leaves nothing.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path} exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise WriteError(path, err.strerror or str(err)) from None
    return path


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
        # Only programs worth caching: tiny ones cost more to look up than to compile.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def run_command(body: Callable[[], int], kept: str) -> int:
    """Run a command's ``body()`` under the commands' contract (module docstring); its exit status.

    ``kept`` says what survives an interruption and how to continue, e.g. "finished stages are kept
    in out/stages; rerun the same command with --resume to continue". Every output is written
    atomically, so an interruption loses at most the unit of work in flight.
    """
    watcher = _InterruptWatcher(kept)
    try:
        return body()
    except BrokenPipeError:
        _close_stdout()
        return 141  # as a command killed by SIGPIPE
    except (DataError, UsageError, StoreError, WriteError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file or folder the command could not read or write
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted: {kept}", file=sys.stderr)
        return 130
    finally:
        watcher.stop()


def _close_stdout() -> None:
    # Python flushes stdout at exit and would report the broken pipe again: point it at nothing.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _InterruptWatcher:
    """Ends the process within ``GRACE`` seconds of Ctrl-C even while the main thread is inside one
    long compiled call (NUTS, a fit), where Python cannot raise KeyboardInterrupt until it returns.

    Python's C-level signal handler writes the signal's number to the wakeup file descriptor at
    once; this thread reads it. If the main thread has not ended the command by itself within the
    grace period, the thread says what is kept, removes the temporary files of writes in flight and
    exits with status 130. Finished stages are already on disk (atomic writes).
    """

    GRACE = 2.0

    def __init__(self, kept: str):
        self.kept, self.done, self.previous = kept, threading.Event(), None
        if threading.current_thread() is not threading.main_thread():
            return  # set_wakeup_fd is for the main thread only: KeyboardInterrupt still applies
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)
        try:
            self.previous = signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            self.reader.close(), self.writer.close()
            return
        self.thread = threading.Thread(target=self._watch, name="sdsl-interrupt", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.is_set():
            try:
                data = self.reader.recv(64)
            except OSError:
                return
            if not data or self.done.is_set():
                return
            if signal.SIGINT in data and not self.done.wait(self.GRACE):
                remove_partial_writes()
                try:
                    print(f"\ninterrupted: {self.kept}", file=sys.stderr, flush=True)
                finally:
                    os._exit(130)

    def stop(self) -> None:
        self.done.set()
        if self.previous is None:
            return
        signal.set_wakeup_fd(self.previous)
        self.writer.close()  # wakes the thread's recv
        self.thread.join(timeout=1.0)
        self.reader.close()
