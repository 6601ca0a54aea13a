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
import os
import platform
import shlex
import signal
import socket
import sys
import tempfile
import threading
import time
from importlib import metadata
from typing import Callable

from sdsl_jax.data import DataError
from sdsl_jax.runtime import COMPILE_CACHE_ENV, configure_jax, default_compile_cache
from sdsl_jax.store import (StoreError, WriteError, append_stage_line, read_stage_lines, remove_partial_writes, write_json,
                            write_text)

# The stage lines and JSON writing live in sdsl_jax.store, the JAX settings in sdsl_jax.runtime; the commands
# take them from here with the rest.
__all__ = [
    "UsageError",
    "Log",
    "sha256",
    "command_line",
    "run_header",
    "versions",
    "check_arguments",
    "read_stage_lines",
    "append_stage_line",
    "make_output_folder",
    "default_compile_cache",
    "configure_jax",
    "run_command",
    "COMPILE_CACHE_ENV",
    "write_json",
    "write_text",
]


class UsageError(Exception):
    """An unusable argument: reported as ``error: ...`` with exit status 2, like a bad CSV."""


class Log:
    """``log(msg)`` prints ``[elapsed] msg`` unless quiet.

    ``with log.heartbeat(10):`` keeps a long step from looking hung: whenever nothing has been
    printed for ``seconds``, a line says how long the work has run since the last line printed, and
    quotes it (from a daemon thread, so it also speaks during one long compiled call such as NUTS).
    The last line announces the step that runs or reports the one that ended; either way the work
    is what comes after it.
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
                    self(f"  ... still working, {running:.0f} s after: {_shorten(step)}")

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


def command_line(prog: str, argv: list[str] | None = None) -> str:
    """``python -m <prog> <argv>`` as a shell reruns it: an argument a shell would split or drop (an
    empty ``--families ""``, a path with a space) is quoted (``argv`` None: the process's own)."""
    return shlex.join(["python", "-m", prog, *(sys.argv[1:] if argv is None else argv)])


def run_header(prog: str, argv: list[str] | None) -> dict:
    """What every result file records of the run that made it: the command line (:func:`command_line`),
    the UTC date and the package versions (``argv`` None: the process's own arguments)."""
    import datetime

    return dict(command=command_line(prog, argv),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), versions=versions())


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("sdsl-jax", "jax", "jaxlib", "numpy", "optax", "flax", "orbax-checkpoint", "numpyro", "arviz"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def check_arguments(args, *, at_least_one: tuple[str, ...] = (), out: str | None = None) -> None:
    """The checks every command makes before any work: each named count at least 1, and an ``--out``
    that is a folder or does not exist yet (UsageError naming the flag)."""
    for name in at_least_one:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if out and os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} exists and is not a folder")


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
        # Ctrl-C raised inside a callback Python cannot propagate from (a garbage-collection
        # callback of JAX's while the main thread waits on a compiled call) would print as an
        # "Exception ignored" traceback; this thread ends the command then, so say nothing.
        self.previous_unraisable = sys.unraisablehook
        sys.unraisablehook = self._unraisable

    def _unraisable(self, unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            self.previous_unraisable(unraisable)

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
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self.previous_unraisable
        self.writer.close()  # wakes the thread's recv
        self.thread.join(timeout=1.0)
        self.reader.close()
