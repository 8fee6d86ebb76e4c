"""`trainplan export`: a plan, as files the engines people already use launch (torchrun,
accelerate, DeepSpeed, Slurm, SkyPilot), as Kaggle/Colab kits, and as the configs of the
fine-tuning frameworks (axolotl, LLaMA-Factory, TRL, torchtune: frameworks.py). One module per
kind; all read the plan through `common.launch_from_plan`.

Every file is rendered in memory first (dataset limits checked, notebooks validated), then written
all or nothing (`write`): into a temporary folder beside --out, then moved into place. Files
already in --out are never changed without `force`; bad input or a failed write leaves nothing."""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TrainplanError

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


def render(ln: Launch, kind: str, *, job_text: str | bytes | None = None,
           dataset: str | None = None, spot: bool | None = None, install: str = "trainplan",
           framework=None) -> dict[str, str | bytes]:
    """{relative path: content} for `kind` ("all": every launcher and kit kind, each in its own
    folder; the Kaggle and Colab kits only where the plan runs on one machine). A framework
    config (FRAMEWORKS) needs `framework`: frameworks.Export."""
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
            if k in ("kaggle", "colab") and ln.nodes > 1:
                continue
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


def check_out(out_dir: str | os.PathLike) -> Path:
    """`--out` as a folder path the export can write into, or one clear error (empty, a file,
    a link that leads nowhere, a name the file system refuses)."""
    text = str(os.fspath(out_dir))
    if not text.strip():
        raise TrainplanError("--out is empty: the export needs a folder to write into.",
                             fix="name a new or empty folder, e.g. --out launch")
    if "\0" in text:
        raise TrainplanError(f"--out {text!r} holds a NUL character.", fix="name a folder")
    root = Path(text)
    try:
        if root.is_symlink() and not root.exists():
            raise TrainplanError(f"--out {text!r} is a symbolic link to {os.readlink(root)!r}, "
                                 "which does not exist (or loops).",
                                 fix="point --out at a folder, or remove the link")
        if root.exists() and not root.is_dir():
            raise TrainplanError(f"--out {text!r} exists and is not a folder.",
                                 fix="name a new or empty folder")
    except OSError as e:
        raise _cannot(text, e) from None
    return root


def _cannot(out, e: OSError) -> TrainplanError:
    full = e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    where = f" ({e.filename})" if e.filename and str(e.filename) != str(out) else ""
    return TrainplanError(
        f"cannot write --out {str(out)!r}: {'the disk is full' if full else e.strerror or e}"
        f"{where}. Nothing was written.",
        fix="free space there, or choose another folder" if full else
            "choose a folder you can write (it is made if missing), with a shorter name")


def conflicts(files: dict[str, str | bytes], root: Path) -> tuple[list[str], list[str]]:
    """(files under `root` the export would change: there with other content; paths that no
    file can replace: a folder where a file goes, a file where a folder goes). A file with the
    same content is neither."""
    change, blocked = set(), set()
    for name, text in files.items():
        for parent in list(reversed(Path(name).parents))[1:]:
            if (root / parent).exists() and not (root / parent).is_dir():
                blocked.add(parent.as_posix())
        dest = root / name
        if dest.is_dir():
            blocked.add(name)
        elif dest.is_symlink() or dest.exists():
            data = text.encode() if isinstance(text, str) else text
            try:
                same = not dest.is_symlink() and dest.read_bytes() == data
            except OSError:
                same = False
            if not same:
                change.add(name)
    return sorted(change), sorted(blocked)


def write(files: dict[str, str | bytes], out_dir: str | os.PathLike,
          force: bool = False) -> list[Path]:
    """Write every file under `out_dir`, all or nothing: into a temporary folder beside it,
    each file fsynced, then moved into place (the whole folder renamed when it is new). A file
    there with other content is refused unless `force`; one with the same content is left as it
    is. A failure (full disk, read-only, ...) leaves nothing behind. Shell scripts executable."""
    root = check_out(out_dir)
    made: list[Path] = []
    tmp, done = None, False
    try:
        change, blocked = conflicts(files, root) if root.exists() else ([], [])
        if blocked or (change and not force):
            clash = blocked + change
            shown = ", ".join(clash[:6]) + (f" and {len(clash) - 6} more" if len(clash) > 6 else "")
            raise TrainplanError(
                f"--out {str(out_dir)!r} already holds what the export would replace: {shown}. "
                "Nothing was written.",
                fix="export into a new or empty folder" + (
                    "" if blocked else ", or add --force to replace those files"))
        for p in reversed(root.parents):
            if not p.exists():
                p.mkdir()
                made.append(p)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name[:40]}.", suffix=".export",
                                    dir=root.parent))
        for name, text in files.items():
            _put(tmp / name, text, executable=name.endswith((".sh", ".sbatch")))
        if not root.exists():
            os.rename(tmp, root)               # a new folder: one rename
            tmp = None
        else:                                  # beside the user's files: only new or --force'd
            moves = [n for n in files if n in change or not (root / n).exists()]
            for name in moves:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
            for name in moves:
                os.replace(tmp / name, root / name)
        done = True
    except OSError as e:
        raise _cannot(out_dir, e) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not done:
            for p in reversed(made):
                try:
                    p.rmdir()
                except OSError:
                    pass
    return [root / name for name in files]


def _put(path: Path, text: str | bytes, executable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
        f.flush()
        os.fsync(f.fileno())
    mode = 0o777 if executable else 0o666
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)
