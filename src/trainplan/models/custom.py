"""`py:<module>:<factory>` source: any nn.Module, with an input spec.

The factory is imported (a dotted module on sys.path, or a path to a .py file, relative to the job
file) and called with the job's `model_args`; `inputs` gives each forward argument's shape (the
string "batch" marks the batch dimension), dtype and, for integer inputs, the exclusive upper
bound. The loss is the model's scalar output, or the mean of its output (a surrogate that
back-propagates through every output, as a loss over them would).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import torch

from ..errors import TrainplanError
from . import ModelBundle

DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "long": torch.int64,
          "int32": torch.int32, "bool": torch.bool}


def _load_factory(ref: str, base_dir: Path | None):
    mod_name, _, fn_name = ref.rpartition(":")
    if not mod_name or not fn_name:
        raise TrainplanError(f"py:{ref} must be py:<module>:<factory>.",
                             fix="for example py:examples/glf_cr.py:build or py:mypkg.models:make")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_absolute() and base_dir is not None and not path.exists():
                path = base_dir / path
            if not path.exists():
                raise TrainplanError(f"py: file {mod_name} does not exist.")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            if base_dir is not None and str(base_dir) not in sys.path:
                sys.path.insert(0, str(base_dir))
            module = importlib.import_module(mod_name)
    except ImportError as e:
        raise TrainplanError(f"Cannot import {mod_name!r}: {e}",
                             fix="check the module is on PYTHONPATH or give a path to a .py file") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise TrainplanError(f"{mod_name} has no {fn_name!r}.")
    return fn


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
    factory = _load_factory(job.model[3:], job.base_dir)
    specs = parse_input_spec(job.inputs)
    with torch.device("meta"):
        module = factory(**(job.model_args or {}))
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
