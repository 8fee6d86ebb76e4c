"""`--to kaggle` and `--to colab`: a kit folder with a notebook (built with nbformat): accelerator
check, install, a 3-step smoke test (`trainplan measure`: predicted against measured), the
training cell under `trainplan_guard`, a resume cell, output packaging. For Kaggle, with
`--dataset DIR`, the dataset package: `dataset/<slug>.zip` and `dataset/dataset-metadata.json`,
checked first against Kaggle's file-count and size limits (data/kaggle_datasets.json).

The kit ships `trainplan_guard/` (a copy of trainplan/guard/: torch and the standard library
only), `trainplan-plan.json` (what the guard reads) and `job.yaml`: the user's job file copied
byte for byte (never re-headed), or, from flags alone, the job written out.

Signals. A notebook's `!python train.py` runs under a pseudo-terminal of the kernel: when the
platform ends the kernel, the training dies of SIGHUP before it can checkpoint. The training
cell starts it in its own session instead (no SIGHUP), passes a SIGTERM, SIGINT or SIGHUP sent
to the kernel on as SIGTERM (the guard saves and stops), waits for it, then ends the kernel as
it was asked. Every value in a cell is a Python literal (repr), the install line a list of
arguments, not shell text. Cells carry tags: `smoke` for the cells a CPU can run (tests execute
them with nbclient), `train` for the training cell."""
from __future__ import annotations

import html
import io
import json
import os
import shlex
import zipfile
from importlib import resources
from pathlib import Path

from ..errors import TrainplanError
from ..units import fmt_bytes
from .common import Launch, one_line, slug
from .torchrun import torchrun_args

WORKDIR = {"kaggle": "/kaggle/working", "colab": "/content"}
JOB_FILE = "job.yaml"


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
    try:
        files, _size = check_dataset(folder)
        root = Path(folder)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files:
                z.write(p, p.relative_to(root).as_posix())
    except OSError as e:
        raise TrainplanError(f"--dataset {str(folder)!r}: cannot read {e.filename or folder}: "
                             f"{e.strerror or e}. Nothing was written.") from None
    meta = {"title": slug, "id": f"{owner}/{slug}", "licenses": [{"name": "CC0-1.0"}]}
    return {f"dataset/{slug}.zip": buf.getvalue(),
            "dataset/dataset-metadata.json": (json.dumps(meta, indent=2) + "\n").encode()}


def guard_copy(ln: Launch) -> dict[str, str]:
    """The guard package as `trainplan_guard/`, file for file as this trainplan has it (so the
    kit's copy is always this version's), each headed by the plan."""
    from ..guard import FILES
    src = resources.files("trainplan").joinpath("guard")
    note = "# A copy of trainplan/guard/ (torch and the standard library only).\n"
    return {f"trainplan_guard/{name}": ln.header() + note + src.joinpath(name).read_text()
            for name in FILES}


def launch_command(ln: Launch) -> list[str]:
    """The training command after the Python interpreter: torchrun's module over several GPUs."""
    if ln.procs_per_node > 1 and ln.accelerator_kind == "gpu":
        return ["-m", "torch.distributed.run", *torchrun_args(ln), *ln.script_command()]
    return ln.script_command()


TRAIN = """
# Its own session: the training does not die of SIGHUP with this kernel. A SIGTERM, SIGINT or
# SIGHUP to the kernel is passed on as SIGTERM (the guard saves and stops), then the kernel ends
# as it was asked.
import atexit, signal, subprocess, sys
proc = subprocess.Popen([sys.executable, *cmd], start_new_session=True, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, bufsize=1)
atexit.register(lambda: proc.poll() is None and proc.send_signal(signal.SIGTERM))
got = []
def pass_on(signum, frame):
    got.append(signum)
    proc.send_signal(signal.SIGTERM)
before = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
try:
    for line in proc.stdout:
        print(line, end='', flush=True)
    code = proc.wait()
finally:
    for s, h in before.items():
        signal.signal(s, h)
if got:
    os.kill(os.getpid(), got[0])
if code:
    raise RuntimeError(f'training exited with status {code}')"""


def notebook(ln: Launch, kind: str, job_file: str, install: str) -> str:
    import nbformat
    from nbformat import v4
    if ln.nodes > 1:
        raise TrainplanError(f"A {kind.title()} kit runs on one machine; this plan needs "
                             f"{ln.nodes} nodes.", fix="export --to torchrun, slurm or skypilot")
    try:
        packages = shlex.split(install)
    except ValueError as e:
        raise TrainplanError(f"--install {install!r} is not a list of pip requirements: {e}.",
                             fix="e.g. --install 'trainplan[vision]==0.1.0'") from None
    if not packages:
        raise TrainplanError("--install is empty.", fix="e.g. --install trainplan")
    wd = WORKDIR[kind]
    ck = f"{wd}/checkpoints"
    env = "\n".join(f"os.environ[{k!r}] = {v!r}" for k, v in ln.env().items())
    hdr = html.escape(ln.header(""), quote=False).replace("\n", "  \n")
    title = html.escape(one_line(f"{ln.job_name} on {ln.platform_name}"), quote=False)
    cells = [
        v4.new_markdown_cell(f"# {title}\n\n{hdr}"),
        v4.new_code_cell(
            "# Accelerator check: what the plan assumes against what this session has\n"
            "import torch\n"
            f"expected, accelerator = {ln.devices!r}, {ln.accelerator_id!r}\n"
            "found = torch.cuda.device_count()\n"
            "print(f'plan: {expected} x {accelerator}; found {found} CUDA device(s)', "
            "[torch.cuda.get_device_name(i) for i in range(found)])\n"
            "if found != expected:\n"
            "    print('WARNING: not the accelerator the plan assumes (Settings > Accelerator)')",
            metadata={"tags": ["smoke"]}),
        v4.new_code_cell(
            "# Install\nimport subprocess, sys\n"
            f"subprocess.check_call([sys.executable, '-m', 'pip', 'install', '-q', *{packages!r}])",
            metadata={"tags": ["install"]}),
        v4.new_code_cell(
            "# Smoke test: 3 real steps, predicted against measured\n"
            "import json, subprocess, sys\n"
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
            + f"\nos.environ['TRAINPLAN_CHECKPOINT_DIR'] = {ck!r}\n"
            + f"cmd = {launch_command(ln)!r}" + TRAIN,
            metadata={"tags": ["train"]}),
        v4.new_markdown_cell(
            "## Resume\nNext session: attach this notebook's previous output (or the checkpoint "
            f"dataset) so `{ck}` holds the checkpoints, then run all cells: the guard resumes "
            "from the newest complete one (model, optimizer, scheduler, RNG states, data "
            "position)."),
        v4.new_code_cell(
            "# Resume: the newest complete checkpoint the guard will load\n"
            "from trainplan_guard import latest_checkpoint\n"
            f"print(latest_checkpoint({ck!r}))", metadata={"tags": ["smoke"]}),
        v4.new_code_cell(
            "# Package the outputs (the newest checkpoint), within the output limits\n"
            "import shutil\n"
            "from trainplan_guard import latest_checkpoint\n"
            f"latest = latest_checkpoint({ck!r})\n"
            "if latest is not None:\n"
            f"    print(shutil.make_archive({wd + '/outputs'!r}, 'zip', latest))",
            metadata={"tags": ["smoke"]}),
    ]
    for i, c in enumerate(cells):          # the same notebook for the same plan, export after export
        c["id"] = f"{kind}-{i}"
    nb = v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "trainplan": {"platform": ln.platform_id, "kind": kind}})
    nbformat.validate(nb)
    return nbformat.writes(nb)


def render(ln: Launch, kind: str, job_text: str | bytes | None, dataset: str | None = None,
           install: str = "trainplan") -> dict[str, str | bytes]:
    """The kit's files. `job_text`: the job file's bytes, copied as they are; None: no job file
    (the notebook's smoke test needs one: the caller writes the job out)."""
    out: dict[str, str | bytes] = {}
    if kind == "kaggle" and dataset:
        out.update(dataset_package(dataset, slug(ln.job_name, "job", 45) + "-data"))
    out[f"{kind}_kit.ipynb"] = notebook(ln, kind, JOB_FILE, install)
    out.update(guard_copy(ln))
    out["trainplan-plan.json"] = ln.guard_json()
    if job_text is not None:
        out[JOB_FILE] = job_text
    out["README.md"] = (ln.header("") + f"\nUpload this folder to {kind.title()}, open "
                        f"`{kind}_kit.ipynb`, run all. Your training script "
                        f"`{one_line(ln.script)}` reads the TRAINPLAN_* environment and uses "
                        "`trainplan_guard` (see trainplan's README, Launching).\n")
    return out
