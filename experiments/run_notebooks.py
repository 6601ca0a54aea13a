"""Execute research notebooks in place, keeping their outputs (``make notebooks``).

    python -m experiments.run_notebooks notebooks/*.ipynb

Each notebook runs top to bottom in a fresh kernel (nbclient, the library behind ``jupyter
execute``) from the repository root, on the committed data and full settings, and is written back
atomically with its outputs, so a reader of the repository sees every table and figure. A failing
cell stops that notebook and leaves the committed copy unchanged. ``make test`` checks every library
call the notebooks make against the library; ``make test-all`` also runs their code on small settings
without touching the committed files (tests/test_notebooks.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sdsl_jax.store import atomic_write


def execute(path: str, *, timeout: int) -> float:
    """Run ``path`` in place; returns the seconds taken."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    env_small = os.environ.pop("SDSL_NOTEBOOK_SMALL", None)  # the committed copies show the full run
    try:
        NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": os.path.dirname(os.path.dirname(os.path.abspath(path)))}}
                       ).execute()
    finally:
        if env_small is not None:
            os.environ["SDSL_NOTEBOOK_SMALL"] = env_small
    atomic_write(path, lambda tmp: nbformat.write(notebook, tmp))
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.run_notebooks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="+", help="notebook files")
    p.add_argument("--timeout", type=int, default=1800, help="seconds a cell may run (1800)")
    args = p.parse_args(argv)
    try:
        import nbclient  # noqa: F401
    except ImportError:
        print("error: nbclient is not installed: run `make notebooks` (it installs the notebooks extra)",
              file=sys.stderr)
        return 2
    for path in args.notebooks:
        print(f"executing {path} ...", flush=True)
        try:
            seconds = execute(path, timeout=args.timeout)
        except Exception as err:  # a failing cell: report it and leave the committed copy alone
            print(f"error: {path} failed, left unchanged:\n{err}", file=sys.stderr)
            return 1
        print(f"  done in {seconds:.0f} s, outputs written to {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
