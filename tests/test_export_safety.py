"""Issue 40, the exports: a user's files are never changed without --force, bad --out values and
job files are one clean error with nothing written, and names are data in every format (every
generated script passes `bash -n` and shellcheck; CI installs shellcheck and sets
TRAINPLAN_REQUIRE_SHELLCHECK=1 so a missing one fails there instead of skipping)."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import json
import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from trainplan.cli.main import main
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
precision: fp16-amp
"""
HOSTILE = "demo\ntouch PWNED; $(touch PWNED2) `touch PWNED3` ' \" \\ \u2028 #x"


def cli(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def clean_error(code, err):
    assert code == 2, err
    assert "Traceback" not in err and err.startswith(("trainplan: error:", "usage:")), err


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("job") / "job.yaml"
    path.write_text(JOB)
    return path


@pytest.fixture(scope="module")
def launches(job):
    """Two plans: one node of 2 x T4 (Kaggle), 2 nodes x 8 H100 (ZeRO-3)."""
    j = load_job(str(job))
    out = []
    for platforms, jj in ((select_platforms(["kaggle-t4x2"]), j),
                          (platforms_with("h100-sxm", 16), j.with_(strategy="zero3"))):
        plan = make_plan(jj, platforms)
        out.append(launch_from_plan(plan, plan.platforms[0], jj, job_file=str(job)))
    return out


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- a user's files --------------------------------------------------------------------------------
def test_export_into_a_folder_of_user_files_changes_none_without_force(job, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    (out / "trainplan-plan.json").write_text("{}\n")
    (out / "job.yaml").write_text("model: hf:gpt2\n")
    (out / "torchrun.sh").write_text("#!/bin/sh\necho mine\n")
    (out / "torchrun.sh").chmod(0o444)
    (out / "data.csv").write_text("a,b\n")
    before = snapshot(out)
    for kind in ("kaggle", "torchrun"):
        code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", kind, "--out", out])
        clean_error(code, err)
        assert "--force" in err and "Nothing was written" in err
        assert snapshot(out) == before and sorted(os.listdir(out)) == sorted(before)
    # `all` writes into one folder per kind: beside the user's files, none of them touched
    assert cli(["export", job, "--platform", "kaggle-t4x2", "--to", "all", "--out", out])[0] == 0
    now = snapshot(out)
    assert {k: now[k] for k in before} == before and len(now) > len(before)
    code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", "torchrun",
                         "--out", out, "--force"])
    assert code == 0, err
    after = snapshot(out)
    assert after["torchrun.sh"][0].startswith(b"#!/usr/bin/env bash")
    assert after["data.csv"] == before["data.csv"] and after["job.yaml"] == before["job.yaml"]
    assert [n for n in os.listdir(out) if n.startswith(".")] == []


def test_the_same_export_twice_changes_nothing(job, tmp_path):
    out = tmp_path / "kit"
    assert cli(["export", job, "--platform", "kaggle-t4x2", "--to", "all", "--out", out])[0] == 0
    first = snapshot(out)
    code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", "all", "--out", out])
    assert code == 0, err
    assert snapshot(out) == first


def test_job_file_is_copied_as_it_is(job, tmp_path):
    """The row where job.yaml gained a header on every export: the kit's job.yaml is the
    user's file byte for byte, and exporting from it again gives the same bytes."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(["export", job, "--platform", "kaggle-t4x2", "--to", "kaggle", "--out", a])[0] == 0
    assert (a / "job.yaml").read_bytes() == job.read_bytes()
    assert cli(["export", a / "job.yaml", "--platform", "kaggle-t4x2", "--to", "kaggle",
                "--out", b])[0] == 0
    assert (b / "job.yaml").read_bytes() == job.read_bytes()


def test_kit_without_a_job_file_writes_the_job(tmp_path):
    """`export --model hf:... --to colab` with no job file: the smoke test's job.yaml is there
    and is the job that was planned."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 4,
                               "vocab_size": 1000, "n_positions": 128}))
    out = tmp_path / "kit"
    code, _o, err = cli(["export", "--model", f"hf:{cfg}", "--seq-len", "32", "--steps", "20",
                         "--platform",
                         "colab-free-t4", "--to", "colab", "--out", out])
    assert code == 0, err
    again = load_job(str(out / "job.yaml"))
    assert again.model == f"hf:{cfg}" and again.seq_len == 32
    nb = json.loads((out / "colab_kit.ipynb").read_text())
    assert any("'job.yaml'" in "".join(c["source"]) for c in nb["cells"])


# --- bad --out values and job files ------------------------------------------------------------
def _odd_outs(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "afile").write_text("x")
    return {"empty": "", "blank": "   ", "dangling link": str(tmp_path / "dangling"),
            "link loop": str(tmp_path / "loop1"), "a file": str(tmp_path / "afile"),
            "under a file": str(tmp_path / "afile" / "sub"),
            "300-character name": str(tmp_path / ("x" * 300)),
            "unwritable place": "/proc/trainplan-export"}


def test_odd_out_values_are_clean_errors_that_write_nothing(job, tmp_path):
    outs = _odd_outs(tmp_path)
    before = sorted(os.listdir(tmp_path))
    for what, out in outs.items():
        code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", "all",
                             "--out", out])
        clean_error(code, err)
        assert sorted(os.listdir(tmp_path)) == before, what
        assert len(err.splitlines()) <= 3, (what, err)


def test_read_only_out_is_a_clean_error(job, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs",
                                            str(ro)], capture_output=True).returncode:
        if os.geteuid() == 0:
            pytest.skip("root without mount: permissions do not stop it writing")
        ro.chmod(0o555)
    try:
        code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", "all",
                             "--out", ro / "launch"])
        clean_error(code, err)
        assert os.listdir(ro) == []
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        ro.chmod(0o755)


@pytest.mark.parametrize("kind", ["tmpfs", "stub"])
def test_full_disk_leaves_nothing_behind(job, tmp_path, monkeypatch, kind):
    """The row where a full disk left 8 of 21 files: a 64 KiB tmpfs where root may mount one,
    or the writer stubbed to fail part-way. Exit 2, and not one file or temp folder stays."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = kind == "tmpfs" and os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    ).returncode == 0
    if kind == "tmpfs" and not mounted:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    if not mounted:
        import errno
        from trainplan import export
        real, n = export._put, [0]

        def put(path, text, executable):
            n[0] += 1
            if n[0] > 8:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real(path, text, executable)
        monkeypatch.setattr(export, "_put", put)
    try:
        code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", "all",
                             "--out", disk / "launch"])
        clean_error(code, err)
        assert "disk is full" in err
        assert os.listdir(disk) == [] or os.listdir(disk) == ["lost+found"]
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.parametrize("what", ["folder", "binary", "empty-name"])
def test_job_file_that_is_not_a_yaml_file(tmp_path, what):
    path = tmp_path / "job.yaml"
    if what == "folder":
        path.mkdir()
    elif what == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    code, _o, err = cli(["export", "" if what == "empty-name" else path, "--platform",
                         "kaggle-t4x2", "--to", "torchrun", "--out", tmp_path / "o"])
    clean_error(code, err)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("steps", ["1e30", str(10**30), "-1", "0", "nan", "inf", "1.5", "x"])
def test_steps_out_of_range_is_said(job, tmp_path, steps):
    code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", "torchrun",
                         "--out", tmp_path / "o", "--steps", steps])
    clean_error(code, err)
    if steps in ("1e30", str(10**30), "inf"):
        assert "out of range" in err
    assert not (tmp_path / "o").exists()


# --- names are data ---------------------------------------------------------------------------
def shellcheck_or_skip() -> str | None:
    found = shutil.which("shellcheck")
    if found is None and os.environ.get("TRAINPLAN_REQUIRE_SHELLCHECK"):
        pytest.fail("shellcheck is required here (TRAINPLAN_REQUIRE_SHELLCHECK) but not installed")
    return found


def scripts_of(files: dict) -> dict[str, str]:
    """Every shell script an export writes: .sh and .sbatch files, and SkyPilot's setup/run."""
    out = {n: t for n, t in files.items() if n.endswith((".sh", ".sbatch"))}
    for n, t in files.items():
        if n.endswith(".yaml") and "sky_task" in n:
            task = yaml.safe_load(t)
            for key in ("setup", "run"):
                out[f"{n}:{key}"] = "#!/usr/bin/env bash\n" + task[key]
    return out


def check_scripts(files: dict, tmp_path: Path) -> None:
    sc = shellcheck_or_skip()
    for name, text in scripts_of(files).items():
        f = tmp_path / name.replace("/", "_").replace(":", "_")
        f.write_text(text)
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
        if sc:
            r = subprocess.run([sc, "--shell=bash", str(f)], capture_output=True, text=True)
            assert r.returncode == 0 and not r.stdout, (name, r.stdout)


def test_every_generated_script_passes_bash_n_and_shellcheck(launches, tmp_path):
    for ln in launches:
        check_scripts(render(ln, "all", spot=True), tmp_path)


def check_formats(files: dict) -> None:
    """Each file parses in its own format; notebook cells are Python."""
    for name, text in files.items():
        if name.endswith(".yaml") and name != "kaggle/job.yaml" and name != "colab/job.yaml":
            yaml.safe_load(text)
        elif name.endswith(".json"):
            json.loads(text)
        elif name.endswith(".ipynb"):
            for c in json.loads(text)["cells"]:
                if c["cell_type"] == "code":
                    ast.parse("".join(c["source"]))
        elif name.endswith(".py"):
            ast.parse(text)


def test_a_hostile_job_name_runs_nothing(launches, tmp_path):
    """The row where `demo\\ntouch PWNED` put a command on line 3 of train.sbatch: the name is
    escaped in comments and sanitised where it is an identifier; every script, run with its
    launchers stubbed, creates no file."""
    ln = dataclasses.replace(launches[0], job_name=HOSTILE, script="my $(touch PWNED4) `x`.py",
                             script_args=("--name", HOSTILE.replace("\n", " ")))
    files = render(ln, "all", spot=True)
    check_formats(files)
    check_scripts(files, tmp_path)
    sbatch = files["slurm/train.sbatch"]
    assert "#SBATCH --job-name=demo-touch-PWNED-touch-PWNED2-touch-PWNED3-x\n" in sbatch
    assert not any(line.startswith("touch") for line in sbatch.splitlines())
    assert "#SBATCH" not in sbatch.split("set -euo pipefail")[1]
    work = tmp_path / "run"
    write(files, work)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for c in ("torchrun", "deepspeed", "scontrol", "srun"):
        (stubs / c).write_text(f'#!/bin/sh\nprintf "%s\\n" "{c}" "$@" > "$0.args"\n')
        (stubs / c).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n0",
           "SLURM_JOB_ID": "1"}
    for script in ("torchrun/torchrun.sh", "deepspeed/deepspeed.sh", "slurm/train.sbatch"):
        r = subprocess.run(["bash", str(work / script)], cwd=work, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, (script, r.stderr)
    assert not list(tmp_path.rglob("PWNED*"))
    args = (stubs / "torchrun.args").read_text().split("\n")
    assert "my $(touch PWNED4) `x`.py" in args                  # one argument, as typed


def test_a_script_name_with_a_space_is_one_word(launches):
    """The row where `--script "my train.py" --to deepspeed` was split in two."""
    ln = dataclasses.replace(launches[0], script="my train.py")
    for kind, name in (("deepspeed", "deepspeed.sh"), ("torchrun", "torchrun.sh"),
                       ("slurm", "train.sbatch")):
        line = next(ln_ for ln_ in render(ln, kind)[name].splitlines()
                    if "my train.py" in ln_ and not ln_.startswith("#"))
        assert "my train.py" in shlex.split(line), (kind, line)


def test_a_script_name_with_a_newline_is_refused(job, tmp_path):
    code, _o, err = cli(["export", job, "--platform", "kaggle-t4x2", "--to", "torchrun",
                         "--out", tmp_path / "o", "--script", "train.py\nrm -rf ~"])
    clean_error(code, err)
    assert "control character" in err and not (tmp_path / "o").exists()


def test_keep_leaves_room_for_the_next_checkpoint(launches):
    """The exported kaggle-t4x2 plan kept floor(disk / size): no slot for the next save."""
    ln = launches[0]
    st = ln.plan_json["storage"]
    fits = [n for n in (st["checkpoints_fit_disk"], st["checkpoints_fit_files"]) if n is not None]
    assert ln.keep_checkpoints == max(1, min(fits) - 1)
    assert json.loads(ln.guard_json())["keep_checkpoints"] == ln.keep_checkpoints
