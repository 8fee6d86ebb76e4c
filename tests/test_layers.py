"""The package's layers, checked on the source with `ast` (nothing is imported or run):

    cli/, report/, measure/, plan/   read the prediction core
    predict/                         the prediction core: imports none of the above
    spec.py, jobfile.py, precision.py, strategy.py, optimizer.py, models/, trace/, configs/
                                     below the core: import none of predict/ and the above

Every `import` and `from ... import` of a module counts, absolute (`trainplan.plan`) or relative
(`..plan`, `from .. import plan`), at module level or inside a function, class or `if`, and so
does `importlib.import_module("trainplan.plan")` with a literal name. Parametrized per file, so a
failure names the file, the line and the import.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "trainplan"

UPPER = ("trainplan.plan", "trainplan.report", "trainplan.measure", "trainplan.cli")
CORE = "trainplan.predict"
LOWER = ("spec.py", "jobfile.py", "precision.py", "strategy.py", "optimizer.py", "models", "trace",
         "configs")


def module_name(path: Path) -> str:
    """Dotted module name of a file under src/ (a package's __init__ is the package)."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(path: Path) -> str:
    """The package relative imports in `path` resolve against."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_modules(source: str, path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of everything the source imports: for `from X import a, b` that is X,
    X.a and X.b (a name may be a submodule: `from .. import plan`)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(path).split(".")
                up = node.level - 1
                if up >= len(base):
                    raise AssertionError(f"{path}:{node.lineno}: relative import beyond the top")
                base = base[:len(base) - up] if up else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) in ("import_module", "__import__"))):
            out.append((node.lineno, node.args[0].value))
    return out


def violations(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    hits = []
    for line, mod in imported_modules(path.read_text(), path):
        for f in forbidden:
            if mod == f or mod.startswith(f + "."):
                hits.append(f"{path.relative_to(PKG.parent)}:{line} imports {mod}")
                break
    return sorted(set(hits))


def _files(*parts: str) -> list[Path]:
    out = []
    for p in parts:
        target = PKG / p
        out += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return out


CORE_FILES = _files("predict")
LOWER_FILES = _files(*LOWER)


def _id(path: Path) -> str:
    return str(path.relative_to(PKG))


def test_the_layers_have_files():
    # a renamed folder must not leave the checks below with nothing to check
    assert len(CORE_FILES) >= 10 and all(p.exists() for p in CORE_FILES)
    assert {p.name for p in CORE_FILES} >= {"__init__.py", "evaluate.py", "memory.py",
                                            "timing.py", "optable.py"}
    assert (PKG / "trace" / "derive" / "traces.py") in LOWER_FILES
    assert PKG / "spec.py" in LOWER_FILES and PKG / "trace" / "tracer.py" in LOWER_FILES
    assert any(p.parent.name == "models" for p in LOWER_FILES)


@pytest.mark.parametrize("path", CORE_FILES, ids=_id)
def test_prediction_core_imports_no_consumer(path):
    bad = violations(path, UPPER)
    assert not bad, ("the prediction core must not import plan/report/measure/cli:\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("path", LOWER_FILES, ids=_id)
def test_lower_layers_import_neither_core_nor_consumers(path):
    bad = violations(path, (CORE,) + UPPER)
    assert not bad, "below the prediction core, nothing may import it or its consumers:\n" + \
        "\n".join(bad)


DERIVE = "trainplan.trace.derive"
# what writes or edits a memory log: the prediction core reads derived traces through
# trace/derive/'s exports and never makes or changes a log itself
LOG_WRITERS = ("trainplan.trace.log", "trainplan.trace.counters")


def derive_exports() -> set[str]:
    """trace/derive/__init__.py's `__all__`, read off its source."""
    tree = ast.parse((PKG / "trace" / "derive" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            return {ast.literal_eval(e) for e in node.value.elts}
    raise AssertionError("trace/derive/__init__.py has no __all__")


@pytest.mark.parametrize("path", CORE_FILES, ids=_id)
def test_prediction_core_reads_derived_traces_only_through_their_exports(path):
    exports = derive_exports()
    bad = []
    for line, mod in imported_modules(path.read_text(), path):
        if mod.startswith(DERIVE + ".") and mod[len(DERIVE) + 1:] not in exports:
            bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {mod}")
        if any(mod == w or mod.startswith(w + ".") for w in LOG_WRITERS):
            bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {mod}")
    assert not bad, ("predict/ reads derived traces through trace/derive's exports and edits no "
                     "memory log:\n" + "\n".join(sorted(set(bad))))


def test_the_derivation_check_sees_an_internal_import():
    fake = PKG / "predict" / "fake_module.py"
    mods = [m for _l, m in imported_modules("from ..trace.derive.stitch import stitch", fake)]
    assert "trainplan.trace.derive.stitch" in mods and "stitch" not in derive_exports()
    assert "Traces" in derive_exports() and "fragmentation" in derive_exports()


# --- the checker itself: it must see every form of import the layers could break with ---------

FAKE = PKG / "predict" / "fake_module.py"
FAKE_INIT = PKG / "predict" / "__init__.py"


@pytest.mark.parametrize("src, expect", [
    ("import trainplan.plan", "trainplan.plan"),
    ("import trainplan.report.console as c", "trainplan.report.console"),
    ("from trainplan.cli.main import main", "trainplan.cli.main"),
    ("from trainplan import measure", "trainplan.measure"),
    ("from ..plan import Planner", "trainplan.plan"),
    ("from ..plan.build import make_plan", "trainplan.plan.build"),
    ("from .. import report", "trainplan.report"),
    ("def f():\n    from ..measure.records import Record\n    return Record",
     "trainplan.measure.records"),
    ("class C:\n    def m(self):\n        if True:\n            import trainplan.cli\n",
     "trainplan.cli"),
    ("import importlib\nimportlib.import_module('trainplan.plan.rank')", "trainplan.plan.rank"),
])
def test_checker_sees_the_import(src, expect):
    mods = [m for _line, m in imported_modules(src, FAKE)]
    assert expect in mods
    assert any(m == f or m.startswith(f + ".") for m in mods for f in UPPER)


@pytest.mark.parametrize("src", [
    "from ..errors import TrainplanError",
    "from ..trace.tracer import Trace",
    "from .memory import estimate_memory",
    "from . import compat",
    "import numpy as np",
    "from ..platforms import Platform",            # not a layer above the core
    "planner = 'trainplan.plan'",                  # a string, not an import
])
def test_checker_allows_what_the_core_may_import(src):
    mods = [m for _line, m in imported_modules(src, FAKE)]
    assert not any(m == f or m.startswith(f + ".") for m in mods for f in UPPER), mods


def test_relative_imports_resolve_from_the_package():
    # in predict/x.py `.` is trainplan.predict; in predict/__init__.py too (the package itself)
    assert ("trainplan.predict.memory" in
            [m for _l, m in imported_modules("from .memory import x", FAKE)])
    assert ("trainplan.predict.memory" in
            [m for _l, m in imported_modules("from .memory import x", FAKE_INIT)])
    assert ("trainplan.plan" in
            [m for _l, m in imported_modules("from .. import plan", FAKE_INIT)])
    deep = PKG / "models" / "hf_configs" / "x.py"
    assert ("trainplan.models.lora" in
            [m for _l, m in imported_modules("from ..lora import y", deep)])
