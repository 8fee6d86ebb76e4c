"""Flags of issue 18: --version, --verbose, `inspect --model`, --check (exit 1 when the job does
not fit), --quiet (no progress display), and `plan --gpu/--gpus` choosing the platforms."""
from __future__ import annotations

import json
from importlib import metadata
from types import SimpleNamespace

import pytest
from plan_examples import run_cli

from trainplan.cli.main import build_parser, main
from trainplan.cli.plan_cmd import runnable
from trainplan.platforms import platforms_with
from trainplan.platforms import load_platforms

TINY = """\
name: tiny
model: {hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128, vocab_size: 256}
batch_size: 4
seq_len: 32
steps: 100
"""
# ~0.4 B parameters (a 400k vocabulary): fp32 weights + Adam do not fit a 4 GB laptop GPU
TOO_BIG = """\
name: too-big
model: {hidden_size: 1024, num_layers: 4, num_heads: 8, intermediate_size: 4096, vocab_size: 400000}
batch_size: 1
seq_len: 32
steps: 10
"""
MODULE = """\
import torch
class M(torch.nn.Module):
    def __init__(self, n):
        super().__init__(); self.l = torch.nn.Linear(4, n)
    def forward(self, x):
        return self.l(x).sum()
def build():
    return M({n})
"""


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


run = run_cli


# --- --version, --verbose -----------------------------------------------------------------------
def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"trainplan {metadata.version('trainplan')}"


# `trainplan ARGS` in a fresh process; its last stderr line says whether PyTorch was imported
# and the exit code
_PROBE = ("import sys\nfrom trainplan.cli.main import main\n"
          "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
          "print('torch' in sys.modules, code, file=sys.stderr)")


def _fresh(*argv):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          timeout=120)


def test_help_version_and_a_missing_job_file_answer_without_loading_pytorch(tmp_path):
    # a newcomer's first commands: `--help`, `--version`, a command's `--help`, a job file that
    # is not there; each answers in a fraction of a second where importing torch takes seconds
    for argv, code in ((["--help"], 0), (["--version"], 0), (["plan", "--help"], 0),
                       (["estimate", "--help"], 0), (["export", "--help"], 0),
                       (["plan", str(tmp_path / "none.yaml")], 2)):
        r = _fresh(*argv)
        assert r.stderr.strip().splitlines()[-1] == f"False {code}", (argv, r.stderr[-500:])


def test_misspelt_names_are_answered_without_loading_pytorch(tmp_path):
    # a misspelt model, accelerator or platform, and the model catalog: each answered from the
    # bundled catalogs before PyTorch is imported (2-3 s here before, 0.2-0.4 s after)
    cases = ((["plan", "--model", "hf:gpt3"], "hf:openai-community/gpt2"),
             (["estimate", "--model", "hf:Llama-3.2-1", "--gpu", "t4"], "hf:meta-llama/Llama-3.2-1B"),
             (["inspect", "--model", "hf:bert-larg"], "Did you mean"),
             (["inspect", "--model", "hf:gpt2", "--gpu", "t5"], "'t4'"),
             (["plan", "--model", "hf:gpt2", "--gpu", "h1000"], "'h100-sxm'"),
             (["estimate", "--model", "hf:gpt2", "--gpu", "t5"], "Did you mean 't4'"),
             (["estimate", "--model", "hf:gpt2", "--task", "generate", "--gpu", "t5"], "'t4'"),
             (["plan", "--model", "hf:gpt2", "--platforms", "kagle-t4x2"], "'kaggle-t4x2'"),
             (["export", "--model", "hf:gpt2", "--platform", "kaggle-t5", "--to", "torchrun",
               "--out", str(tmp_path / "kit")], "'kaggle-t4x2'"))
    for argv, hint in cases:
        r = _fresh(*argv)
        assert r.stderr.strip().splitlines()[-1] == "False 2", (argv, r.stderr[-500:])
        assert hint in r.stderr, (argv, r.stderr[-500:])
    assert not (tmp_path / "kit").exists()
    r = _fresh("catalog", "models")
    assert r.stderr.strip().splitlines()[-1] == "False 0" and "gpt2" in r.stdout, r.stderr[-500:]


def test_verbose_before_or_after_the_command():
    p = build_parser()
    assert p.parse_args(["--verbose", "catalog"]).verbose is True
    assert p.parse_args(["catalog", "--verbose"]).verbose is True
    assert p.parse_args(["plan", "-v"]).verbose is True
    assert p.parse_args(["catalog"]).verbose is False


# --- inspect --model / job file -----------------------------------------------------------------
@pytest.fixture
def py_models(tmp_path):
    for name, n in (("a", 4), ("b", 8)):
        (tmp_path / f"{name}.py").write_text(MODULE.format(n=n))
    job = tmp_path / "job.yaml"
    job.write_text(f"model: py:{tmp_path / 'a.py'}:build\n"
                   "inputs:\n  - {name: x, shape: [batch, 4], dtype: float32}\n")
    return tmp_path, str(job)


def _params(capsys, *argv) -> int:
    code, out, err = run(capsys, "inspect", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)["params"]["total"]


def test_inspect_accepts_model_and_job_file_like_estimate(capsys, py_models):
    d, job = py_models
    b = f"py:{d / 'b.py'}:build"
    assert _params(capsys, job) == 4 * 4 + 4                      # job file positional
    assert _params(capsys, job, "--model", b) == 4 * 8 + 8        # --model overrides the file
    assert _params(capsys, "--model", b, "--job", job) == 40
    assert _params(capsys, b, "--job", job) == 40                 # model positional, as before


def test_inspect_two_different_models_is_bad_input(capsys, py_models):
    d, job = py_models
    code, _, err = run(capsys, "inspect", f"py:{d / 'a.py'}:build", "--model",
                       f"py:{d / 'b.py'}:build", "--job", job)
    assert code == 2 and "Two models" in err


# --- --check ------------------------------------------------------------------------------------
def test_estimate_check_exits_1_only_when_it_does_not_fit(capsys, tmp_path, tiny):
    big = tmp_path / "big.yaml"
    big.write_text(TOO_BIG)
    code, out, _ = run(capsys, "estimate", str(big), "--gpu", "rtx-3050-laptop-4gb", "--check",
                       "--format", "json")
    assert code == 1 and json.loads(out)["fits"] is False       # still printed
    code, out, _ = run(capsys, "estimate", str(big), "--gpu", "rtx-3050-laptop-4gb",
                       "--format", "json")
    assert code == 0                                             # without --check: a result
    code, out, _ = run(capsys, "estimate", tiny, "--gpu", "t4", "--check", "--format", "json")
    assert code == 0 and json.loads(out)["fits"] is True
    code, _, err = run(capsys, "estimate", tiny, "--gpu", "no-such-gpu", "--check")
    assert code == 2 and err.startswith("trainplan: error:")


def test_plan_check(capsys, tiny):
    code, out, _ = run(capsys, "plan", tiny, "--platforms", "kaggle-p100", "--check",
                       "--format", "json")
    assert code == 1                                  # retired: nowhere to run it
    assert [p["verdict"] for p in json.loads(out)["platforms"]] == ["RETIRED"]
    code, out, _ = run(capsys, "plan", tiny, "--platforms", "kaggle-p100", "--format", "json")
    assert code == 0
    code, out, _ = run(capsys, "plan", tiny, "--platforms", "kaggle-p100,colab-free-t4", "--check",
                       "--format", "json")
    assert code == 0
    code, _, err = run(capsys, "plan", tiny, "--platforms", "nowhere", "--check")
    assert code == 2


@pytest.mark.parametrize("verdicts, ok", [
    (["READY"], True), (["READY WITH CHANGES", "WON'T FIT"], True), (["TIGHT"], True),
    (["WON'T FIT", "RETIRED"], False), ([], False)])
def test_runnable(verdicts, ok):
    plan = SimpleNamespace(platforms=[SimpleNamespace(verdict=v) for v in verdicts])
    assert runnable(plan) is ok


def test_check_is_in_the_help(capsys):
    for command in ("plan", "estimate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--check" in out and "exit 1" in out
    from trainplan.cli import estimate_cmd, plan_cmd
    assert "--check" in plan_cmd.__doc__ and "--check" in estimate_cmd.__doc__


# --- --quiet ------------------------------------------------------------------------------------
def test_plan_quiet_has_no_progress_display(capsys, monkeypatch, tiny):
    import trainplan.report.plan_rich as plan_rich
    calls = []
    real = plan_rich.tracing_progress

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(plan_rich, "tracing_progress", spy)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")    # rich: treat stderr as a terminal
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["plan", tiny, "--platforms", "colab-free-t4", "--format", "json"]
    code, _, err = run(capsys, *argv)
    assert code == 0 and calls and "tracing" in err          # on a terminal: shown
    calls.clear()
    code, _, err = run(capsys, *argv, "--quiet")
    assert code == 0 and not calls and err == ""             # --quiet: none
    monkeypatch.delenv("TTY_COMPATIBLE")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    code, _, err = run(capsys, *argv)
    assert code == 0 and err == ""                           # stderr not a terminal: none


def test_estimate_accepts_quiet():
    assert build_parser().parse_args(["estimate", "--quiet"]).quiet is True


# --- plan --gpu / --gpus ------------------------------------------------------------------------
def _plan(capsys, *argv):
    code, out, err = run(capsys, "plan", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def test_plan_gpu_and_gpus_choose_the_platform_and_the_global_batch(capsys, tiny):
    d = _plan(capsys, tiny, "--gpu", "h100", "--gpus", "4")
    expected = [p.id for p in load_platforms().values() if p.is_current
                and p.accelerator_id == "h100-sxm" and p.accelerator_count == 4]
    assert expected and [p["platform_id"] for p in d["platforms"]] == expected
    assert d["target_batch"] == 4 * 4                         # batch 4 on each of 4 devices
    assert all(p["devices"] == 4 and p["micro_batch_size"] == 4 for p in d["platforms"])


def test_plan_gpu_builds_a_platform_the_catalog_lacks(capsys, tiny):
    catalog = load_platforms()
    assert not any(p.accelerator_id == "a100-sxm4-80gb" and p.accelerator_count == 2
                   for p in catalog.values())
    d = _plan(capsys, tiny, "--gpu", "a100-80gb", "--gpus", "2")
    (p,) = d["platforms"]
    assert p["platform_id"] == "a100-sxm4-80gb-x2" and p["devices"] == 2
    assert p["accelerator_id"] == "a100-sxm4-80gb" and d["target_batch"] == 8
    rate = min(q.usd_per_hour / q.accelerator_count for q in catalog.values()
               if q.is_current and q.accelerator_id == "a100-sxm4-80gb" and q.usd_per_hour > 0)
    assert p["cost"]["usd_per_hour"] == pytest.approx(2 * rate)


def test_platforms_with():
    h100 = platforms_with("H100", None)
    assert {p.accelerator_count for p in h100} >= {1, 8}
    assert all(p.accelerator_id == "h100-sxm" and p.is_current for p in h100)
    assert {p.accelerator_count for p in platforms_with(None, 4)} == {4}
    built = platforms_with("t4", 3)
    assert [p.id for p in built] == ["t4-x3"] and built[0].devices == 3
    assert "t4-x3" not in load_platforms()


def test_plan_gpu_bad_input_exits_2(capsys, tiny):
    code, _, err = run(capsys, "plan", tiny, "--gpus", "3")
    assert code == 2 and "3 accelerators" in err
    code, _, err = run(capsys, "plan", tiny, "--gpu", "h100", "--platforms", "colab-free-t4")
    assert code == 2 and "--platforms" in err
    code, _, err = run(capsys, "plan", tiny, "--gpu", "h1000")
    assert code == 2


def test_job_file_gpu_does_not_choose_platforms(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(TINY + "gpu: h100\ngpus: 2\nplatforms: [colab-free-t4]\n")
    d = _plan(capsys, str(job))
    assert [p["platform_id"] for p in d["platforms"]] == ["colab-free-t4"]
    assert d["target_batch"] == 8



def test_a_plan_answered_from_stored_traces_never_loads_pytorch(tmp_path, monkeypatch):
    # the first plan traces (PyTorch imported); the second reads every trace from the store and
    # answers the same without importing torch (1.3 s of a warm plan on 2 cores): a stored
    # trace's facts, semantics and stack unpickle without it (docs/design.md, data flow)
    job = tmp_path / "tiny.yaml"
    job.write_text("model: transformer\n"
                   "transformer: {hidden_size: 64, num_layers: 2, num_heads: 4,\n"
                   "              intermediate_size: 128, vocab_size: 256, kind: decoder}\n"
                   "batch_size: 2\nseq_len: 32\nprecision: fp16-amp\nsteps: 100\ngpu: t4\n")
    # and a model of the user's own config.json, whose fields are checked against transformers'
    # config class: read once, then from the cache folder (models/hf_validate.py)
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64,
           "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("TRAINPLAN_TRACE_CACHE", str(tmp_path / "traces"))   # its own: cold first
    for argv in (["plan", str(job), "--format", "json"],
                 ["plan", "--model", f"hf:{tmp_path / 'config.json'}", "--seq-len", "32",
                  "--batch-size", "2", "--gpu", "t4", "--steps", "100", "--format", "json"]):
        cold, warm = _fresh(*argv), _fresh(*argv)
        assert cold.stderr.strip().splitlines()[-1] == "True 0", cold.stderr[-500:]
        assert warm.stderr.strip().splitlines()[-1] == "False 0", warm.stderr[-500:]
        assert json.loads(warm.stdout) == json.loads(cold.stdout)


def test_inspect_reads_the_step_estimate_and_plan_read(capsys):
    """`inspect` reads the step `estimate` and `plan` read (trace/derive): a deep stack traced
    cut, its totals and every module's parameters and activations those of the whole trace, and
    kept in the trace store, so the same inspect again traces nothing."""
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.target import semantics_for
    from trainplan.spec import Job, validate
    from trainplan.trace.tracer import trace_step
    argv = ["inspect", "hf:openai-community/gpt2", "--batch-size", "3", "--seq-len", "96",
            "--format", "json"]
    first = json.loads(run(capsys, *argv)[1])
    again = json.loads(run(capsys, *argv)[1])
    assert not first["from_trace_store"] and again["from_trace_store"]
    assert "traced with 4 of its 12 alike blocks" in " ".join(first["notes"])
    job = validate(Job(model="hf:openai-community/gpt2", batch_size=3, seq_len=96))
    whole = trace_step(job, semantics_for(job, get_accelerator("a100-sxm4-80gb")))
    for phase, families in whole.flops.items():
        assert first["flops"][phase] == pytest.approx(families, rel=1e-9)
    assert first["peak_allocated_bytes"] == whole.peak_allocated_bytes
    assert [(m["name"], m["params"], m["activation_bytes"]) for m in first["modules"]] == \
        [(m.name, m.params, m.activation_bytes) for m in whole.modules]
