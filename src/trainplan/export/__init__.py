"""`trainplan export`: a plan, as files the engines people already use launch (torchrun,
accelerate, DeepSpeed, Slurm, SkyPilot), as Kaggle/Colab kits, and as the configs of the
fine-tuning frameworks (axolotl, LLaMA-Factory, TRL, torchtune: frameworks.py). One module per
kind; all read the plan through `common.launch_from_plan`.

Every file is rendered in memory first (dataset limits checked, notebooks validated), then each is
written with `atomic_write`: bad input writes nothing."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TrainplanError
from ..paths import atomic_write

if TYPE_CHECKING:
    from .common import Launch

KINDS = ("torchrun", "accelerate", "deepspeed", "slurm", "skypilot", "kaggle", "colab")
FRAMEWORKS = ("axolotl", "llama-factory", "trl", "torchtune")   # need the job (`framework=`)

__all__ = ["FRAMEWORKS", "KINDS", "Launch", "launch_from_plan", "render", "write"]


def __getattr__(name: str):
    """`Launch` and `launch_from_plan`, from common.py when first asked for: it reads a plan
    (and imports PyTorch), which the command line's parser, reading KINDS, does not need."""
    if name in ("Launch", "launch_from_plan"):
        from . import common
        return getattr(common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def render(ln: Launch, kind: str, *, job_text: str | None = None, dataset: str | None = None,
           spot: bool | None = None, install: str = "trainplan",
           framework=None) -> dict[str, str | bytes]:
    """{relative path: content} for `kind` ("all": every launcher and kit kind, each in its own
    folder). A framework config (FRAMEWORKS) needs `framework`: frameworks.Export."""
    if kind in FRAMEWORKS:
        if framework is None:
            raise TrainplanError(f"--to {kind} needs the planned job.")
        from . import axolotl, llamafactory, torchtune, trl
        writer = {"axolotl": axolotl, "llama-factory": llamafactory, "trl": trl,
                  "torchtune": torchtune}[kind]
        return {**writer.render(framework), "trainplan-plan.json": ln.guard_json()}
    if kind == "all":
        out: dict[str, str | bytes] = {}
        for k in KINDS:
            for name, text in render(ln, k, job_text=job_text,
                                     dataset=dataset if k == "kaggle" else None, spot=spot,
                                     install=install).items():
                out[f"{k}/{name}"] = text
        return out
    if kind not in KINDS:
        raise TrainplanError(f"--to {kind!r} is not an export kind.",
                             allowed=", ".join(KINDS + FRAMEWORKS + ("all",)))
    if dataset and kind != "kaggle":
        raise TrainplanError("--dataset packages a Kaggle dataset: use it with --to kaggle (or all).")
    if kind == "torchrun":
        from .torchrun import render as r
        files = r(ln)
    elif kind == "accelerate":
        from .accelerate import render as r
        files = r(ln)
    elif kind == "deepspeed":
        from .deepspeed import render as r
        files = r(ln)
    elif kind == "slurm":
        from .slurm import render as r
        files = r(ln)
    elif kind == "skypilot":
        from .skypilot import render as r
        files = r(ln, spot)
    else:
        from .kits import render as r
        return r(ln, kind, job_text, dataset, install)
    files = dict(files)
    files["trainplan-plan.json"] = ln.guard_json()
    return files


def write(files: dict[str, str | bytes], out_dir: str | os.PathLike) -> list[Path]:
    """Write every file under `out_dir` (each atomically); shell scripts executable."""
    root = Path(out_dir)
    if root.exists() and not root.is_dir():
        raise TrainplanError(f"--out {str(out_dir)!r} exists and is not a folder.")
    written = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
        if name.endswith(".sh") or name.endswith(".sbatch"):
            path.chmod(path.stat().st_mode | 0o111)
        written.append(path)
    return written
