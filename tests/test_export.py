"""`trainplan export`: each kind's files validated by the real library (accelerate's config
classes, DeepSpeed's config parser, torchrun's argument parser, nbformat + nbclient), SkyPilot's
YAML against its schema vendored from the 0.14.1 wheel (skypilot does not install here), Slurm's
script by `bash -n`; values equal the plan's; a Kaggle dataset over a limit is refused, nothing
written."""
from __future__ import annotations

import json
from pathlib import Path
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from trainplan.errors import TrainplanError
from trainplan.export import launch_from_plan, render, write
from trainplan.plan import make_plan, select_platforms
from trainplan.platforms import platforms_with
from trainplan.jobfile import load_job

JOB = """name: tiny
model: transformer
transformer: {hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128, vocab_size: 256, kind: decoder}
batch_size: 4
seq_len: 32
steps: 50
precision: %s
strategy: %s
"""


def _plan(tmp, precision, strategy, platforms, name):
    path = tmp / f"{name}.yaml"
    path.write_text(JOB % (precision, strategy))
    job = load_job(str(path))
    plan = make_plan(job, platforms)
    return plan, job, path


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exp")
    plan, job, path = _plan(tmp, "fp16-amp", "single", select_platforms(["kaggle-t4x2"]), "k")
    pp = plan.platform("kaggle-t4x2")
    return plan, pp, launch_from_plan(plan, pp, job, job_file=str(path)), path


@pytest.fixture(scope="module")
def multinode(tmp_path_factory):
    """ZeRO-3 with CPU optimizer offload on 16 x H100: 2 nodes of 8."""
    tmp = tmp_path_factory.mktemp("exp")
    plan, job, path = _plan(tmp, "bf16-amp", "zero3", platforms_with("h100-sxm", 16), "m")
    job = job.with_(offload="optimizer")
    plan = make_plan(job, platforms_with("h100-sxm", 16))
    pp = plan.platforms[0]
    return plan, pp, launch_from_plan(plan, pp, job, job_file=str(path)), path


def test_values_come_from_the_plan(kaggle):
    _plan_, pp, ln, _ = kaggle
    assert (ln.micro_batch_size, ln.grad_accum, ln.devices, ln.strategy.name, ln.precision.name) == (
        pp.micro_batch_size, pp.grad_accum, pp.devices, pp.strategy, pp.precision)
    assert ln.session_max_s == pp.sessions.session_max_s == 43200
    assert ln.checkpoint_every_steps == pp.sessions.checkpoint_every_steps
    for text in render(ln, "all").values():
        if isinstance(text, str) and not text.startswith("{"):
            assert "kaggle-t4x2" in text.split("\n", 12)[0] + text[:2000]


def test_accelerate_config_loads_with_accelerate(kaggle, multinode, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    for name, (_p, pp, ln, _) in {"k": kaggle, "m": multinode}.items():
        f = tmp_path / f"{name}.yaml"
        f.write_text(render(ln, "accelerate")["accelerate_config.yaml"])
        cfg = load_config_from_file(str(f))
        assert cfg.num_processes == pp.devices and cfg.num_machines == ln.nodes
        want = {"fp16-amp": "fp16", "bf16-amp": "bf16"}[pp.precision]
        assert str(cfg.mixed_precision).lower().endswith(want)
    assert str(cfg.distributed_type).endswith("DEEPSPEED")
    assert cfg.deepspeed_config["zero_stage"] == 3
    assert cfg.deepspeed_config["offload_optimizer_device"] == "cpu"
    assert cfg.deepspeed_config["gradient_accumulation_steps"] == pp.grad_accum


def test_deepspeed_json_passes_deepspeed_parsing(multinode, monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as dsc
    _p, pp, ln, _ = multinode
    files = render(ln, "deepspeed")
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: pp.devices)
    cfg = dsc.DeepSpeedConfig(json.loads(files["ds_config.json"]))
    assert cfg.zero_optimization_stage == 3
    assert cfg.train_micro_batch_size_per_gpu == pp.micro_batch_size
    assert cfg.gradient_accumulation_steps == pp.grad_accum
    assert cfg.train_batch_size == pp.global_batch_size
    assert cfg.bfloat16_config.enabled and not cfg.float16_config.enabled
    assert cfg.zero_config.offload_optimizer is not None
    host = files["hostfile"].splitlines()
    assert [h for h in host if not h.startswith("#")] == ["node-0 slots=8", "node-1 slots=8"]


def test_deepspeed_json_keys_and_types_are_deepspeeds(multinode):
    """Without deepspeed installed (CI: it builds from source only with DS_BUILD_OPS=0 and no
    build isolation), the JSON is checked against the key set and field types DeepSpeed's config
    module defines (tests/data/deepspeed_config_keys.json, extracted from DeepSpeed 0.19.8)."""
    keys = json.loads((Path(__file__).parent / "data" / "deepspeed_config_keys.json").read_text())
    _p, pp, ln, _ = multinode
    cfg = json.loads(render(ln, "deepspeed")["ds_config.json"])
    for k in cfg:
        assert k == "_comment" or k in keys["top_level"] or k in keys, k
    for section in ("zero_optimization", "fp16", "bf16"):
        for k, v in cfg.get(section, {}).items():
            assert k in keys[section], (section, k)
            if k in ("offload_optimizer", "offload_param"):
                assert set(v) <= set(keys[k]), (k, v)
    assert isinstance(cfg["train_micro_batch_size_per_gpu"], int)
    assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"]
                                       * cfg["gradient_accumulation_steps"] * pp.devices)
    assert cfg["zero_optimization"]["stage"] in (0, 1, 2, 3)


def _torchrun_line(text):
    line = next(l for l in text.splitlines() if "torchrun " in l and not l.startswith("#"))
    line = line.split("torchrun ", 1)[1].replace('"$@"', "")
    line = re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", line).replace("$MASTER_ADDR", "10.0.0.1")
    return shlex.split(line.replace("$SKYPILOT_NODE_RANK", "0").replace("$SKYPILOT_TASK_ID", "1"))


def test_torchrun_command_parses_with_torchrun(kaggle, multinode):
    from torch.distributed.run import get_args_parser
    a = get_args_parser().parse_args(_torchrun_line(render(kaggle[2], "torchrun")["torchrun.sh"]))
    assert a.standalone and a.nproc_per_node == "2" and a.training_script == "train.py"
    ln = multinode[2]
    a = get_args_parser().parse_args(_torchrun_line(render(ln, "torchrun")["torchrun.sh"]))
    assert (a.nnodes, a.nproc_per_node, a.rdzv_backend) == ("2", "8", "c10d")
    sky = yaml.safe_load(render(ln, "skypilot")["sky_task.yaml"])
    a = get_args_parser().parse_args(_torchrun_line(sky["run"]))
    assert (a.nnodes, a.nproc_per_node, a.rdzv_endpoint) == ("2", "8", "10.0.0.1:29500")


def test_skypilot_yaml_matches_skypilot_schema(kaggle, multinode):
    jsonschema = pytest.importorskip("jsonschema")
    from skypilot_schema import RESOURCES_SCHEMA, TASK_SCHEMA
    ln = multinode[2]
    files = render(ln, "skypilot", spot=True)
    for name in ("sky_task.yaml", "sky_task_spot.yaml"):
        task = yaml.safe_load(files[name])
        jsonschema.validate(task, TASK_SCHEMA)
        jsonschema.validate(task["resources"], RESOURCES_SCHEMA)
        assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
    assert yaml.safe_load(files["sky_task_spot.yaml"])["resources"]["use_spot"] is True
    assert yaml.safe_load(render(kaggle[2], "skypilot")["sky_task.yaml"])["resources"][
        "accelerators"] == "T4:2"


def test_slurm_script(multinode, tmp_path):
    ln = multinode[2]
    text = render(ln, "slurm")["train.sbatch"]
    f = tmp_path / "t.sbatch"
    f.write_text(text)
    assert subprocess.run(["bash", "-n", str(f)]).returncode == 0
    opts = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", text, re.M))
    assert opts["nodes"] == "2" and opts["gpus-per-node"] == "8" and "requeue" in opts
    assert opts["time"] != ""
    assert "srun" in text and "$HEAD_NODE:29500" in text


def test_kaggle_kit_notebook_and_smoke_cells(kaggle, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    _p, _pp, ln, path = kaggle
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("x")
    files = render(ln, "kaggle", job_text=path.read_text(), dataset=str(data))
    written = write(files, tmp_path / "kit")
    names = {p.relative_to(tmp_path / "kit").as_posix() for p in written}
    assert {"kaggle_kit.ipynb", "trainplan_guard/__init__.py", "trainplan-plan.json", "job.yaml",
            "dataset/dataset-metadata.json"} <= names
    assert any(n.startswith("dataset/") and n.endswith(".zip") for n in names)
    nb = nbformat.read(tmp_path / "kit" / "kaggle_kit.ipynb", as_version=4)
    nbformat.validate(nb)
    smoke = nbformat.v4.new_notebook(cells=[c for c in nb.cells
                                            if "smoke" in c.get("metadata", {}).get("tags", [])],
                                     metadata=nb.metadata)
    for c in smoke.cells:       # a CPU: the smoke test measures on the CPU
        c.source = c.source.replace("'--format', 'json'", "'--format', 'json', '--device', 'cpu'")
        c.source = c.source.replace("/kaggle/working", str(tmp_path / "kit"))
    nbclient.NotebookClient(smoke, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path / "kit")}}).execute()
    out = "".join(o.get("text", "") for c in smoke.cells for o in c.get("outputs", []))
    assert "predicted:" in out and "measured:" in out


def test_kaggle_dataset_over_file_limit_is_refused(kaggle, tmp_path, monkeypatch):
    from trainplan.export import kits
    monkeypatch.setattr(kits, "kaggle_limits", lambda: {"max_files": 3, "max_bytes": 10**9})
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        (data / f"f{i}").write_text("x")
    with pytest.raises(TrainplanError, match="at most 3 files"):
        render(kaggle[2], "kaggle", dataset=str(data))
    monkeypatch.setattr(kits, "kaggle_limits", lambda: {"max_files": 10, "max_bytes": 2})
    with pytest.raises(TrainplanError, match="size limit"):
        render(kaggle[2], "all", dataset=str(data))


def test_cli_refuses_dataset_over_limit_writes_nothing(kaggle, tmp_path):
    """The real limit (1000 files) through the CLI: exit 2, one message, no folder."""
    _p, _pp, _ln, path = kaggle
    data = tmp_path / "data"
    data.mkdir()
    for i in range(1001):
        (data / f"f{i}").touch()
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "trainplan.cli.main", "export", str(path),
                        "--platform", "kaggle-t4x2", "--to", "kaggle", "--out", str(out),
                        "--dataset", str(data)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "1000" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
