"""`--to kaggle` and `--to colab`: a kit folder with a notebook (built with nbformat): accelerator
check, install, a 3-step smoke test (`trainplan measure`: predicted against measured), the
training command under `trainplan.guard`, a resume cell, output packaging. For Kaggle, with
`--dataset DIR`, the dataset package: `dataset/<slug>.zip` and `dataset/dataset-metadata.json`,
checked first against Kaggle's file-count and size limits (data/kaggle_datasets.json).

The kit ships `trainplan_guard.py` (a copy of trainplan/guard.py: torch and the standard
library only), `trainplan-plan.json` (what the guard reads) and the job file. Cells carry tags:
`smoke` for the cells a CPU can run (tests execute them with nbclient)."""
from __future__ import annotations

import io
import json
import os
import zipfile
from importlib import resources
from pathlib import Path

from ..errors import TrainplanError
from ..units import fmt_bytes
from .common import Launch
from .torchrun import torchrun_args, _shell

WORKDIR = {"kaggle": "/kaggle/working", "colab": "/content"}


def kaggle_limits() -> dict:
    text = resources.files("trainplan").joinpath("data").joinpath("kaggle_datasets.json").read_text()
    return json.loads(text)


def dataset_files(folder: str | os.PathLike) -> list[Path]:
    root = Path(folder)
    if not root.is_dir():
        raise TrainplanError(f"--dataset {str(folder)!r} is not a folder.")
    return sorted(p for p in root.rglob("*") if p.is_file())


def check_dataset(folder: str | os.PathLike) -> tuple[list[Path], int]:
    """The folder's files and total bytes; TrainplanError naming the limit when it does not fit."""
    lim = kaggle_limits()
    files = dataset_files(folder)
    if len(files) > lim["max_files"]:
        raise TrainplanError(
            f"--dataset {str(folder)!r} has {len(files)} files; a Kaggle dataset holds at most "
            f"{lim['max_files']} files (the file-count limit). Nothing was written.",
            fix="pack the files into fewer archives (tar/parquet shards) and export again")
    size = sum(p.stat().st_size for p in files)
    if size > lim["max_bytes"]:
        raise TrainplanError(
            f"--dataset {str(folder)!r} holds {fmt_bytes(size)}; a Kaggle dataset holds at most "
            f"{fmt_bytes(lim['max_bytes'])} (the size limit). Nothing was written.",
            fix="upload a smaller subset, or shard it over several datasets")
    return files, size


def dataset_package(folder, slug: str, owner: str = "YOUR-KAGGLE-USERNAME") -> dict[str, bytes]:
    files, _size = check_dataset(folder)
    root = Path(folder)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            z.write(p, p.relative_to(root).as_posix())
    meta = {"title": slug, "id": f"{owner}/{slug}", "licenses": [{"name": "CC0-1.0"}]}
    return {f"dataset/{slug}.zip": buf.getvalue(),
            "dataset/dataset-metadata.json": (json.dumps(meta, indent=2) + "\n").encode()}


def notebook(ln: Launch, kind: str, job_file: str, install: str) -> str:
    import nbformat
    from nbformat import v4
    wd = WORKDIR[kind]
    ck = f"{wd}/checkpoints"
    if ln.procs_per_node > 1 and ln.accelerator_kind == "gpu":
        train = "!torchrun " + _shell(torchrun_args(ln)) + " " + _shell(ln.script_command())
    else:
        train = "!python " + _shell(ln.script_command())
    env = "\n".join(f"os.environ[{k!r}] = {v!r}" for k, v in ln.env().items())
    hdr = ln.header("").replace("\n", "  \n")
    cells = [
        v4.new_markdown_cell(f"# {ln.job_name} on {ln.platform_name}\n\n{hdr}"),
        v4.new_code_cell(
            "# Accelerator check: what the plan assumes against what this session has\n"
            "import torch\n"
            f"expected = {ln.devices}\n"
            "found = torch.cuda.device_count()\n"
            f"print(f'plan: {{expected}} x {ln.accelerator_id}; found {{found}} CUDA device(s)', "
            "[torch.cuda.get_device_name(i) for i in range(found)])\n"
            "if found != expected:\n"
            "    print('WARNING: not the accelerator the plan assumes (Settings > Accelerator)')",
            metadata={"tags": ["smoke"]}),
        v4.new_code_cell(f"# Install\n%pip install -q {install}", metadata={"tags": ["install"]}),
        v4.new_code_cell(
            "# Smoke test: 3 real steps, predicted against measured\n"
            f"import json, subprocess, sys\n"
            f"r = subprocess.run(['trainplan', 'measure', {job_file!r}, '--steps', '3', "
            "'--warmup', '1', '--format', 'json'], capture_output=True, text=True)\n"
            "if r.returncode:\n"
            "    raise SystemExit(r.stderr)\n"
            "rec = json.loads(r.stdout)\n"
            "print('predicted:', json.dumps(rec.get('predicted'), default=str)[:400])\n"
            "print('measured: ', json.dumps(rec.get('measured'), default=str)[:400])",
            metadata={"tags": ["smoke"]}),
        v4.new_code_cell(
            "# Training: the plan's values; trainplan_guard.SessionGuard.from_plan(os.environ"
            "['TRAINPLAN_PLAN'], os.environ['TRAINPLAN_CHECKPOINT_DIR']) in the script checkpoints "
            "and stops before the session limit\nimport os\n" + env
            + f"\nos.environ['TRAINPLAN_CHECKPOINT_DIR'] = {ck!r}\n" + train,
            metadata={"tags": ["train"]}),
        v4.new_markdown_cell(
            "## Resume\nNext session: attach this notebook's previous output (or the checkpoint "
            f"dataset) so `{ck}` holds the checkpoints, then run all cells: the guard resumes "
            "from the newest (model, optimizer, scheduler, RNG states, data position)."),
        v4.new_code_cell(
            "# Resume: the newest checkpoint the guard will load\n"
            "from trainplan_guard import SessionGuard\n"
            f"print(SessionGuard({ck!r}, signals=False).latest())", metadata={"tags": ["smoke"]}),
        v4.new_code_cell(
            "# Package the outputs (the newest checkpoint), within the output limits\n"
            "import shutil\n"
            "from trainplan_guard import SessionGuard\n"
            f"latest = SessionGuard({ck!r}, signals=False).latest()\n"
            "if latest is not None:\n"
            f"    print(shutil.make_archive({wd + '/outputs'!r}, 'zip', latest))",
            metadata={"tags": ["smoke"]}),
    ]
    nb = v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "trainplan": {"platform": ln.platform_id, "kind": kind}})
    nbformat.validate(nb)
    return nbformat.writes(nb)


def render(ln: Launch, kind: str, job_text: str | None, dataset: str | None = None,
           install: str = "trainplan") -> dict[str, str | bytes]:
    job_file = "job.yaml"
    out: dict[str, str | bytes] = {}
    if kind == "kaggle" and dataset:
        slug = "".join(c if c.isalnum() else "-" for c in ln.job_name.lower()).strip("-") + "-data"
        out.update(dataset_package(dataset, slug))
    out[f"{kind}_kit.ipynb"] = notebook(ln, kind, job_file, install)
    out["trainplan_guard.py"] = (ln.header() + "# A copy of trainplan/guard.py (torch and the "
                                 "standard library only).\n"
                                 + resources.files("trainplan").joinpath("guard.py").read_text())
    out["trainplan-plan.json"] = ln.guard_json()
    if job_text is not None:
        out[job_file] = ln.header() + job_text
    out["README.md"] = (ln.header("") + f"\nUpload this folder to {kind.title()}, open "
                        f"`{kind}_kit.ipynb`, run all. Your training script `{ln.script}` reads "
                        "the TRAINPLAN_* environment and uses `trainplan_guard`.\n")
    return out
