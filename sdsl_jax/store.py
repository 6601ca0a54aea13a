"""Files that cannot half-happen: atomic writes, content digests and resumable stages.

Every file the library and the commands write goes through :func:`atomic_write`: the bytes go to a
temporary file in the destination's folder, are flushed to disk (fsync), and the file is renamed
into place, so a reader sees the old file or the new one, never a part. A failed write (a full
disk, a read-only folder) removes its temporary file and raises :class:`WriteError` naming the
destination.

:class:`StageStore` keeps finished units of work (a point fit, a posterior) keyed by a digest of
what they were computed from: the content of the data actually parsed (:func:`content_digest`,
so a file edited in place, data read from a pipe, or a changed label or weight is never mistaken
for the old input) and every setting the unit depends on. A stage that cannot be read back is
discarded with one line and recomputed.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import os
import re
import tempfile
import threading
import zipfile
from typing import Any, Callable

import numpy as np

__all__ = [
    "WriteError",
    "StoreError",
    "atomic_write",
    "write_text",
    "write_json",
    "finite_or_none",
    "read_stage_lines",
    "append_stage_line",
    "shard_stage_path",
    "stage_files",
    "remove_partial_writes",
    "content_digest",
    "StageStore",
]


class WriteError(OSError):
    """An output could not be written; ``path`` names the destination, nothing partial is left."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"cannot write {path}: {reason}")
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return self.args[0]


class StoreError(ValueError):
    """A stage folder that cannot be used (for example a file where the folder should be)."""


_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> str:
    """Write ``path`` by ``write(temporary_path)``, then fsync and rename it into place.

    The temporary file sits in the destination's folder (a rename never crosses file systems) and
    keeps the destination's extension (writers that pick a format from it, such as matplotlib's,
    see the right one). On any failure it is removed.

    Returns:
      ``path``.

    Raises:
      WriteError: the folder cannot be made, or the write, flush or rename failed (``ENOSPC``,
        ``EROFS``, ``EACCES``, ...); the message names ``path`` and the reason.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".tmp" + os.path.splitext(base)[1])
        os.close(fd)
        os.chmod(tmp, _new_file_mode(path))  # mkstemp's 0600 would make every output private
    except OSError as err:
        raise WriteError(path, err.strerror or str(err)) from None
    with _in_flight_lock:
        _in_flight.add(tmp)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_folder(folder)
    except BaseException as err:
        _unlink(tmp)
        if isinstance(err, OSError) and not isinstance(err, WriteError):
            raise WriteError(path, err.strerror or str(err)) from None
        raise
    finally:
        with _in_flight_lock:
            _in_flight.discard(tmp)
    return path


def _new_file_mode(path: str) -> int:
    """The mode an ordinary write would give: the replaced file's, else 0666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        pass
    global _umask
    if _umask is None:
        _umask = os.umask(0o022)
        os.umask(_umask)
    return 0o666 & ~_umask


_umask: int | None = None


def write_text(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write`)."""

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, write)


def remove_partial_writes() -> None:
    """Remove the temporary files of writes still in flight (a process about to end abruptly)."""
    with _in_flight_lock:
        for tmp in list(_in_flight):
            _unlink(tmp)
        _in_flight.clear()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_folder(folder: str) -> None:
    # The rename is durable only once the folder's entry is on disk; not every system allows it.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def content_digest(*objects: Any) -> str:
    """SHA-256 of the content of data tables, arrays and plain values, in order.

    Dataclass tables (:class:`~sdsl_jax.data.PretrainingRuns`, ...) contribute every column,
    labels and weights included, but not the path they were read from: two files with the same
    rows give the same digest, an edited label or a changed weight another.
    """
    h = hashlib.sha256()
    for obj in objects:
        _feed(h, obj)
    return h.hexdigest()


_NOT_CONTENT = {"path", "sha256"}


def _feed(h, obj) -> None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(f"<{type(obj).__name__}>".encode())
        for f in dataclasses.fields(obj):
            if f.name not in _NOT_CONTENT:
                h.update(f.name.encode())
                _feed(h, getattr(obj, f.name))
    elif isinstance(obj, np.ndarray) or isinstance(obj, np.generic):
        a = np.ascontiguousarray(obj)
        h.update(f"<array {a.dtype.str} {a.shape}>".encode())
        h.update(a.tobytes())
    elif isinstance(obj, (list, tuple)) and any(isinstance(v, np.ndarray) for v in obj):
        h.update(f"<seq {len(obj)}>".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(json.dumps(obj, sort_keys=True, default=repr).encode())


class StageStore:
    """Finished units of work in ``<folder>/stages/``, each keyed by a fingerprint of its inputs.

    Written atomically when a unit ends; with ``resume=True`` a unit whose fingerprint matches is
    loaded instead of recomputed, so an interruption loses at most the unit in flight. ``inputs``
    must name everything a unit depends on: the data's :func:`content_digest` (never a path, which
    can be read again with other content) and every setting. A stored unit that cannot be read
    back (truncated, garbled) is discarded with one line to ``log`` and recomputed.

    Raises:
      StoreError: ``<folder>/stages`` (or ``folder``) exists and is not a folder.
      WriteError: the folder cannot be made.
    """

    def __init__(self, folder: str, *, resume: bool, inputs: dict, log: Callable[[str], None] = lambda _: None):
        self.folder, self.dir, self.resume, self.log = folder, os.path.join(folder, "stages"), resume, log
        self.inputs = json.dumps(inputs, sort_keys=True, default=repr)
        for path in (folder, self.dir):
            if os.path.exists(path) and not os.path.isdir(path):
                raise StoreError(f"{path} exists and is not a folder: the finished stages are kept there (move the "
                                 "file away or choose another --out)")
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as err:
            raise WriteError(self.dir, err.strerror or str(err)) from None

    def _key(self, name: str) -> str:
        return hashlib.sha256(f"{name}|{self.inputs}".encode()).hexdigest()

    def _discard(self, name: str, paths: list[str], err: BaseException) -> None:
        self.log(f"stage {name}: stored copy unreadable ({type(err).__name__}: {str(err)[:80]}); discarded, "
                 "recomputing")
        for path in paths:
            _unlink(path)

    def load(self, name: str) -> dict | None:
        """The arrays of unit ``name`` if stored with the same fingerprint (and ``resume``), else None."""
        path = os.path.join(self.dir, name + ".npz")
        if not (self.resume and os.path.exists(path)):
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                if str(data["fingerprint"]) != self._key(name):
                    return None
                return {k: data[k] for k in data.files if k != "fingerprint"}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            self._discard(name, [path], err)
            return None

    def save(self, name: str, **arrays) -> None:
        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez(f, fingerprint=self._key(name), **arrays)

        atomic_write(os.path.join(self.dir, name + ".npz"), write)

    def posterior(self, name: str, sample: Callable[[], Any]):
        """``sample()`` unless a finished run is stored; the run's netCDF is ``<folder>/<name>.nc``.

        Returns:
          ``(run, reused)``.
        """
        from sdsl_jax import infer
        from sdsl_jax.infer.sampler import az  # ArviZ, imported quietly in one place

        nc_path = os.path.join(self.folder, name + ".nc")
        cached = self.load(name)
        if cached is not None and os.path.exists(nc_path):
            try:
                samples = {k[2:]: v for k, v in cached.items() if k.startswith("s_")}
                diagnostics = infer.Diagnostics.from_record(json.loads(str(cached["diagnostics"])))
                idata = az.from_netcdf(nc_path)
                idata.posterior.load()  # read now: a truncated file fails here, not later
                return infer.PosteriorRun(samples, idata, diagnostics), True
            except Exception as err:  # noqa: BLE001 - any unreadable stage is recomputed
                self._discard(name, [nc_path, os.path.join(self.dir, name + ".npz")], err)
        run_ = sample()
        infer.save_inference_data(run_.inference_data, nc_path)
        self.save(name, diagnostics=json.dumps(run_.diagnostics._asdict()),
                  **{f"s_{k}": v for k, v in run_.samples.items()})
        return run_, False


def finite_or_none(obj):
    """NaN and infinities as None (JSON null), recursively: strict JSON parsers reject NaN."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def write_json(path: str, obj, *, strict: bool = False) -> None:
    """Write ``obj`` as JSON atomically (:func:`sdsl_jax.store.atomic_write`).

    ``strict=True`` writes standard JSON: NaN and infinities become null (each summary records the
    status that says why a value is missing).
    """
    if strict:
        obj = finite_or_none(obj)
    text = json.dumps(obj, indent=2, allow_nan=not strict) + "\n"
    write_text(path, text)


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


def shard_stage_path(stage_path: str, index: int, shards: int) -> str:
    """The stage file of shard ``index`` of ``shards`` processes sharing ``stage_path``'s study:
    ``<stem>-IofK<ext>`` (each process appends to its own file)."""
    stem, ext = os.path.splitext(stage_path)
    return f"{stem}-{index}of{shards}{ext}"


def stage_files(stage_path: str | None) -> list[str]:
    """``stage_path`` and its shards' files (:func:`shard_stage_path`), those that exist: what a
    study sharing them reads."""
    if stage_path is None:
        return []
    stem, ext = os.path.splitext(stage_path)
    own = re.compile(re.escape(os.path.basename(stem)) + r"-\d+of\d+" + re.escape(ext))
    shards = sorted(p for p in glob.glob(glob.escape(stem) + "-*" + ext) if own.fullmatch(os.path.basename(p)))
    return [p for p in [stage_path, *shards] if os.path.exists(p)]


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
