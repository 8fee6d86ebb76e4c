"""`py:<module>:<factory>` source: any nn.Module, with an input spec.

The factory is imported (a dotted module on sys.path, or a path to a .py file, relative to the job
file) and called with the job's `model_args`; `inputs` gives each forward argument's shape (the
string "batch" marks the batch dimension), dtype and, for integer inputs, the exclusive upper
bound. The loss is the model's scalar output, or the mean of its output (a surrogate that
back-propagates through every output, as a loss over them would).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import re
import site
import sys
import sysconfig
import traceback
from pathlib import Path

from ..errors import TrainplanError
from . import ModelBundle
from .meta import on_meta

# an input's dtype as the job writes it -> torch's name for it (torch is imported only to build:
# a job is checked, and a plan answered from stored traces, without it)
DTYPES = {"float32": "float32", "float": "float32", "float16": "float16",
          "bfloat16": "bfloat16", "int64": "int64", "long": "int64",
          "int32": "int32", "bool": "bool"}


# The torch/torchvision pair this project installs (constraints.txt); named in the fix for a
# mismatched pair, read from constraints.txt when it is at hand.
PINNED_PAIR = {"torch": "2.13.0", "torchvision": "0.28.0"}


def _pinned_pair() -> dict[str, str]:
    pins = dict(PINNED_PAIR)
    path = Path(__file__).resolve().parents[3] / "constraints.txt"   # <repo>/src/trainplan/models
    try:
        for line in path.read_text().splitlines():
            m = re.match(r"\s*(torch|torchvision)\s*==\s*([\w.+-]+)", line)
            if m:
                pins[m.group(1)] = m.group(2)
    except OSError:
        pass
    return pins


def _is_torchvision_mismatch(e: BaseException) -> bool:
    """torchvision built for another torch: `import torchvision` fails with "operator
    torchvision::nms does not exist" (RuntimeError) or an ImportError/undefined symbol naming it."""
    if not isinstance(e, (ImportError, RuntimeError, OSError, AttributeError)):
        return False
    frames = traceback.extract_tb(e.__traceback__)
    return "torchvision" in str(e) or any("torchvision" in Path(f.filename).parts for f in frames)


def user_code_error(e: BaseException, user_file: str | Path | None, doing: str) -> TrainplanError:
    """An exception raised by the user's own model code -> a TrainplanError that says so: the
    file and line (the traceback's last frame in the user's file), the exception, the likely fix."""
    where = str(user_file) if user_file else "your model code"
    func = None
    if user_file:
        target = Path(user_file).resolve()
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if Path(f.filename).resolve() == target]
        if frames:
            where = f"{frames[-1].filename}, line {frames[-1].lineno}"
            func = frames[-1].name
    text = " ".join(str(e).split()) or "(no message)"
    if len(text) > 300:
        text = text[:297] + "..."
    what = (f"Your model code raised {type(e).__name__} while {doing}: {text} "
            f"(at {where}{f', in {func}' if func and func != '<module>' else ''}).")
    if _is_torchvision_mismatch(e):
        pins = _pinned_pair()
        return TrainplanError(
            what + " torch and torchvision do not match: this torchvision was built for another "
            "torch.", allowed=f"the matched pair torch=={pins['torch']} with "
                              f"torchvision=={pins['torchvision']} (constraints.txt)",
            fix="install the matched pair: pip install -c constraints.txt torch torchvision "
                f"(in the trainplan checkout; it pins torch=={pins['torch']}, "
                f"torchvision=={pins['torchvision']}), or pip install torch=={pins['torch']} "
                f"torchvision=={pins['torchvision']}")
    if isinstance(e, ModuleNotFoundError) and e.name:
        fix = f"install the package your code imports (pip install {e.name.split('.')[0]}), " \
              "or remove that import"
    elif isinstance(e, TypeError) and "argument" in text and doing.startswith("calling"):
        fix = "make the job's model_args match the factory's parameters"
    else:
        fix = f"fix the error at {where}; run the file with python to see the whole traceback"
    return TrainplanError(what, fix=fix)


def _py_path(mod_name: str, base_dir: Path | None) -> Path:
    """A `py:` file reference as given, or else relative to the job file's folder."""
    path = Path(mod_name)
    if not path.is_absolute() and base_dir is not None and not path.exists():
        path = base_dir / path
    return path


def entry_file(job) -> Path | None:
    """The file a `py:` job's factory lives in, found without running it (None: not found)."""
    mod_name = job.model[3:].rpartition(":")[0]
    if mod_name.endswith(".py"):
        path = _py_path(mod_name, job.base_dir)
        return path.resolve() if path.is_file() else None
    try:
        found = importlib.util.find_spec(mod_name)
    except (ImportError, ValueError):
        return None
    origin = getattr(found, "origin", None)
    return Path(origin).resolve() if origin and Path(origin).is_file() else None


def user_files() -> list[Path]:
    """The .py files of every module loaded now from outside Python's installation (its
    standard library and site-packages) and outside trainplan: the user's model code and what it
    imports from their own folders, which a `py:` trace depends on (trace/store.py checks them
    before reading one back)."""
    found = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        path = _users(f)
        if path is not None and path.is_file():
            found.add(path)
    return sorted(found)


@functools.cache
def _outside() -> tuple[Path, ...]:
    """Python's installation (prefixes, standard library, site-packages) and trainplan."""
    return tuple({Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                              *sysconfig.get_paths().values(),
                                              site.getusersitepackages())}
                 | {Path(__file__).resolve().parents[1]})       # trainplan's own package


@functools.cache
def _users(file: str) -> Path | None:
    """A module's file, resolved, where it lies outside `_outside()` (else None); memoised: a
    trace asks about each of ~3,000 loaded modules (0.13 s unmemoised)."""
    path = Path(file).resolve()
    return None if any(path.is_relative_to(o) for o in _outside()) else path


def _load_factory(ref: str, base_dir: Path | None):
    mod_name, _, fn_name = ref.rpartition(":")
    if not mod_name or not fn_name:
        raise TrainplanError(f"py:{ref} must be py:<module>:<factory>.",
                             fix="for example py:examples/glf_cr.py:build or py:mypkg.models:make")
    user_file = None
    try:
        if mod_name.endswith(".py"):
            path = _py_path(mod_name, base_dir)
            if not path.exists():
                raise TrainplanError(f"py: file {mod_name} does not exist.")
            user_file = path
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(path.stem, None)      # no half-run module left behind
                raise
        else:
            if base_dir is not None and str(base_dir) not in sys.path:
                sys.path.insert(0, str(base_dir))
            try:
                found = importlib.util.find_spec(mod_name)
            except (ImportError, ValueError):
                found = None
            if found is None:
                raise TrainplanError(f"Cannot import {mod_name!r}: no such module.",
                                     fix="check the module is on PYTHONPATH or give a path to a "
                                         ".py file")
            user_file = found.origin
            module = importlib.import_module(mod_name)
    except (TrainplanError, KeyboardInterrupt):
        raise
    except BaseException as e:   # noqa: BLE001 -- the user's module failed (or exited) importing
        raise user_code_error(e, user_file, f"importing {mod_name}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise TrainplanError(f"{mod_name} has no {fn_name!r}.")
    return fn


def _factory_file(factory) -> str | None:
    try:
        return inspect.getsourcefile(factory)
    except TypeError:
        return getattr(sys.modules.get(getattr(factory, "__module__", "")), "__file__", None)


def parse_input_spec(spec) -> list[dict]:
    if not spec:
        raise TrainplanError(
            "A py: model needs an input spec: the shape and dtype of each forward input.",
            fix="add to the job, e.g.\n  inputs:\n    - {name: x, shape: [batch, 3, 128, 128], "
                "dtype: float32}\n(\"batch\" marks the batch dimension)")
    out = []
    for i, item in enumerate(spec):
        if not isinstance(item, dict) or "shape" not in item:
            raise TrainplanError(f"inputs[{i}] needs at least `shape` (and `name`, `dtype`).")
        dtype = str(item.get("dtype", "float32"))
        if dtype not in DTYPES:
            raise TrainplanError(f"inputs[{i}] has dtype {dtype!r}.", allowed=", ".join(DTYPES))
        shape = item["shape"]
        if not any(d == "batch" for d in shape):
            raise TrainplanError(f"inputs[{i}] shape {shape} has no 'batch' dimension.",
                                 fix="write the batch dimension as the string batch")
        out.append({"name": item.get("name", f"input{i}"), "shape": shape,
                    "dtype": DTYPES[dtype], "high": int(item.get("high", 2))})
    return out


def build_custom(job) -> ModelBundle:
    import torch
    factory = _load_factory(job.model[3:], job.base_dir)
    specs = [dict(s, dtype=getattr(torch, s["dtype"])) for s in parse_input_spec(job.inputs)]
    try:
        with on_meta():
            module = factory(**(job.model_args or {}))
    except (TrainplanError, KeyboardInterrupt):
        raise
    except BaseException as e:   # noqa: BLE001 -- the user's factory failed (or exited)
        raise user_code_error(e, _factory_file(factory), f"calling {job.model[3:]}") from None
    if not isinstance(module, torch.nn.Module):
        raise TrainplanError(f"{job.model} returned {type(module).__name__}, not an nn.Module.")

    def make_inputs(batch: int):
        out = {}
        for s in specs:
            shape = [batch if d == "batch" else int(d) for d in s["shape"]]
            if s["dtype"].is_floating_point:
                out[s["name"]] = torch.randn(shape, dtype=s["dtype"])
            else:
                out[s["name"]] = torch.randint(0, s["high"], shape, dtype=s["dtype"])
        return out

    def loss(out, inputs):
        if isinstance(out, (tuple, list)):
            return sum(o.float().mean() for o in out if isinstance(o, torch.Tensor))
        out = getattr(out, "loss", out)
        return out if out.dim() == 0 else out.float().mean()

    seq = job.seq_len
    return ModelBundle(name=job.model, module=module, kind="custom", make_inputs=make_inputs,
                       loss=loss, tokens_per_sample=seq)
