"""Research notebooks: every library call they make checked against the library (fast), and each
run top to bottom on small settings (SDSL_NOTEBOOK_SMALL=1; slow, ``make test-all``).

``make notebooks`` executes them in full on the committed data. The static check below catches what
breaks a notebook when the library changes (a renamed function, a removed keyword, a moved data
file) in a second; the run executes the code cells in order as one script in a fresh interpreter
(no Jupyter kernel), a failing cell failing the test with its traceback. ``02_ladder`` runs on the
micro ladder trained by the ``micro_ladder`` fixture.
"""

import ast
import importlib
import inspect
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).parents[1]
NOTEBOOKS = sorted(ROOT.joinpath("notebooks").glob("*.ipynb"))
OURS = ("sdsl_jax", "experiments")


def _code(path: pathlib.Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _ours(obj) -> bool:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", "") or ""
    return name.split(".")[0] in OURS


def _imported_names(tree: ast.Module) -> dict:
    """Local name -> the object it names, for the notebook's imports from this project."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OURS:
                    names[a.asname or a.name.split(".")[0]] = importlib.import_module(a.name if a.asname else
                                                                                      a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OURS:
            module = importlib.import_module(node.module)
            for a in node.names:
                if not hasattr(module, a.name):
                    module_name = f"{node.module}.{a.name}"
                    names[a.asname or a.name] = importlib.import_module(module_name)  # a submodule
                else:
                    names[a.asname or a.name] = getattr(module, a.name)
    return names


def _resolve(node: ast.expr, names: dict):
    """The project object an expression like ``sd.pipeline.rank_drafts`` names; None for anything else."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        if base is None or not (isinstance(base, (types.ModuleType, type))):
            return None
        assert hasattr(base, node.attr), f"{ast.unparse(node)}: {base.__name__} has no attribute {node.attr!r}"
        return getattr(base, node.attr)
    return None


def _data_paths(tree: ast.Module) -> list[pathlib.Path]:
    """The files a notebook reads, from ``os.path.join`` over ``REPO`` (the repository root) and the
    folders assigned from it (``DATA = os.environ.get(..., os.path.join(REPO, 'fits', 'ladder'))``)."""
    folders, paths = {"REPO": ROOT}, []

    def join(node):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.join"):
            return None
        parts = []
        for a in node.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                parts.append(a.value)
            elif isinstance(a, ast.Name) and a.id in folders:
                parts.append(folders[a.id])
            else:
                return None
        return pathlib.Path(*parts) if parts and isinstance(parts[0], pathlib.Path) else None

    for node in ast.walk(tree):
        path = join(node)
        if path is not None:
            paths.append(path)
    for stmt in tree.body:  # folders, in the order the notebook assigns them
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = stmt.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "os.environ.get" and len(value.args) == 2:
                value = value.args[1]
            folder = join(value)
            if folder is not None:
                folders[stmt.targets[0].id] = folder
                paths.extend(p for p in map(join, ast.walk(tree)) if p is not None)
    return sorted(set(paths))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_calls_match_the_library(path):
    """Every name a notebook takes from the project exists, every call to one binds to its signature
    (no unknown keyword, not too many positional arguments), every data file it names exists, and
    the committed copy holds no error output."""
    tree = ast.parse(_code(path))
    names = _imported_names(tree)
    calls = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            _resolve(node, names)
        if isinstance(node, ast.Call):
            fn = _resolve(node.func, names)
            if fn is None or not callable(fn) or not _ours(fn):
                continue
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue
            try:
                signature = inspect.signature(fn)
            except (TypeError, ValueError):
                continue
            try:
                signature.bind_partial(*node.args, **{k.arg: k.value for k in node.keywords})
            except TypeError as err:
                raise AssertionError(f"{path.name}: `{ast.unparse(node)[:120]}` does not fit "
                                     f"{fn.__qualname__}{signature}: {err}") from None
            calls += 1
    data = _data_paths(tree)
    missing = [str(p.relative_to(ROOT)) for p in data if not p.exists()]
    assert not missing, f"{path.name} reads {missing}, which do not exist"
    assert calls > 0 and data, f"{path.name}: no library call or data file found: the check would test nothing"
    errors = [o for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: the committed copy holds an error output: {errors[0].get('ename')}"


def test_the_static_check_catches_a_renamed_function_a_wrong_keyword_and_a_missing_file(tmp_path):
    good = NOTEBOOKS[0]
    cells = json.loads(good.read_text())
    for bad in ("sd.no_such_function(1.0)\n", "sd.solve_draft_size(1.0, no_such_keyword=2)\n",
                "load_pretraining(os.path.join(REPO, 'fits', 'no_such_file.csv'))\n"):
        broken = dict(cells, cells=cells["cells"] + [{"cell_type": "code", "source": [bad], "metadata": {},
                                                      "outputs": [], "execution_count": None}])
        path = tmp_path / "broken.ipynb"
        path.write_text(json.dumps(broken))
        with pytest.raises(AssertionError):
            test_notebook_calls_match_the_library(path)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, request):
    code = _code(path)
    script = tmp_path / (path.stem + ".py")
    script.write_text("import matplotlib\nmatplotlib.use('Agg')\n" + code)
    env = dict(os.environ, SDSL_NOTEBOOK_SMALL="1", TMPDIR=str(tmp_path))
    if "SDSL_LADDER_DATA" in code:
        # 02_ladder reads the micro ladder's measurements (the committed fits/ladder-v1 on full settings).
        env["SDSL_LADDER_DATA"] = str(request.getfixturevalue("micro_ladder")[1])
    proc = subprocess.run([sys.executable, str(script)], cwd=path.parents[1], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
