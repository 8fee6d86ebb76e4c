"""Bad input, measured by fuzzing (issue 18): whatever a job file, a flag or a local config.json
holds, `trainplan` ends with exit 0 (a result) or exit 2 and one `trainplan: error:` message --
never a traceback -- and a failing command leaves an existing --report file as it was.

Every case runs in-process through `trainplan.cli.main.main`. Hypothesis runs derandomized
(a fixed seed: the same examples on every run) with few examples per test, and the models are
tiny (GPT-2's bundled config cut to 1 block of width 64, sequences of 32), so the file stays well
under a minute on 2 cores.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainplan.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {p.name: yaml.safe_load(p.read_text())
            for p in sorted((ROOT / "examples").glob("*.yaml"))}
GPT2 = json.loads(
    (ROOT / "src/trainplan/models/hf_configs/openai-community--gpt2.json").read_text())
# the bundled GPT-2 config, cut down so a trace takes about a second
TINY = {**GPT2, "n_layer": 1, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128,
        "bos_token_id": 0, "eos_token_id": 0}


def fuzz(max_examples: int) -> settings:
    """A fixed seed (the same examples every run), no deadline, a bounded number of examples."""
    return settings(derandomize=True, max_examples=max_examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class _Validated(Exception):
    """Raised by the stubbed estimate: the job got through parsing and validation."""


def run_cli(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of `trainplan argv`; any exception other than argparse's SystemExit
    escapes (and fails the test)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:     # argparse: a bad flag is its usage line and exit 2
            code = e.code
        except _Validated:
            code = 0
    return code, err.getvalue()


def assert_clean(code, err: str, argv) -> None:
    assert code in (0, 2), f"exit {code} for {argv}:\n{err}"
    assert "Traceback" not in err, f"traceback for {argv}:\n{err}"
    if code == 2:
        lines = [ln for ln in err.splitlines()
                 if ln.strip() and not ln.startswith("[transformers]")]
        assert lines, f"exit 2 with no message for {argv}"
        first = lines[0]
        if first.startswith("usage:"):      # argparse's own message
            assert any(": error: " in ln for ln in lines), err
        else:
            assert first.startswith("trainplan: error:"), f"for {argv}:\n{err}"
            # one message: what is wrong, then at most its Allowed/To fix lines
            assert len(lines) <= 8, f"message too long for {argv}:\n{err}"


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(TINY))
    return path


# -- values of the wrong type or shape ----------------------------------------------------------

WORDS = ["", "---", "abc", "12", "1e3", "fp16", "-1", "none", "t4", "q_proj,v_proj"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 48),
                    st.floats(-2.0, 64.0, allow_nan=False), st.sampled_from(WORDS))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "name", "rank", "shape"]),
                                                 inner, max_size=2)), max_leaves=4)


# -- local config.json files -------------------------------------------------------------------

config_keys = st.sampled_from(sorted(TINY) + ["hidden_size", "num_attention_heads",
                                              "num_hidden_layers", "intermediate_size"])
model_types = st.sampled_from(["gpt2", "bert", "llama", "t5", "not-a-model"])


@st.composite
def configs(draw):
    if draw(st.integers(0, 9)) == 0:        # not a JSON object at all
        return draw(st.one_of(st.lists(scalars, max_size=3), scalars))
    cfg = copy.deepcopy(TINY)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(config_keys)
        cfg[key] = draw(model_types) if key == "model_type" else draw(values)
    return cfg


@fuzz(12)
@given(cfg=configs())
def test_fuzzed_config_json(tmp_path_factory, cfg):
    path = tmp_path_factory.mktemp("fz") / "config.json"
    path.write_text(json.dumps(cfg))
    argv = ["estimate", "--model", f"hf:{path}", "--gpu", "t4", "--seq-len", "32"]
    assert_clean(*run_cli(argv), argv)


@pytest.mark.parametrize("change, says", [
    ({"n_embd": "64"}, "n_embd must be a positive whole number"),
    ({"n_layer": 0}, "n_layer must be a positive whole number; 0 is zero"),
    ({"n_embd": -64}, "n_embd must be a positive whole number; -64"),
    ({"n_head": 5}, "n_embd 64 is not divisible by n_head 5"),
    ({"n_head": 0}, "n_head must be a positive whole number"),
    ({"vocab_size": 1000.5}, "vocab_size must be a positive whole number"),
    ({"n_layer": 5000}, "n_layer 5000 is more blocks than any published model"),   # not a hang
    ({"model_type": "bert"}, "model_type 'bert' does not match the config's fields: its n_embd"),
    ({"model_type": "llama", "architectures": None}, "n_embd, n_layer, n_head are not llama"),
    ({"architectures": ["BertForMaskedLM"]},
     "model_type 'gpt2' does not match architectures 'BertForMaskedLM'"),
    ({"model_type": ["gpt2"]}, "model_type must be a string"),
    ({"architectures": "GPT2LMHeadModel"}, "architectures must be a list of class names"),
    ({"activation_function": "nope"}, "transformers could not build a model from"),
])
def test_bad_config_fields_are_named(tmp_path, change, says):
    """The classes the fuzzer found: each is one message naming the file and the field."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, **change}))
    argv = ["estimate", "--model", f"hf:{path}", "--gpu", "t4", "--seq-len", "32"]
    code, err = run_cli(argv)
    assert code == 2 and says in err and str(path) in err, err
    assert err.startswith("trainplan: error:") and "Traceback" not in err


@pytest.mark.parametrize("top", [[1, 2], "config", 3, None])
def test_config_that_is_not_an_object(tmp_path, top):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(top))
    code, err = run_cli(["estimate", "--model", f"hf:{path}", "--gpu", "t4"])
    assert code == 2 and "object" in err and str(path) in err, err
    assert err.startswith("trainplan: error:") and "Traceback" not in err


def test_every_bundled_config_passes_the_checks():
    from trainplan.models.hf_names import bundled_ids, load_config_dict
    from trainplan.models.hf_validate import check_fields_match, check_model_ref
    for hub_id in bundled_ids():
        check_model_ref(f"hf:{hub_id}")
        check_fields_match(load_config_dict(hub_id)[0], hub_id)


# -- YAML job files ----------------------------------------------------------------------------

def _paths(d, prefix=()):
    """Every key path of a nested mapping (a section, the keys inside it, list items)."""
    for k, v in (d.items() if isinstance(d, dict) else enumerate(d)):
        yield prefix + (k,)
        if isinstance(v, (dict, list)):
            yield from _paths(v, prefix + (k,))


EXAMPLE_PATHS = [(name, path) for name, job in EXAMPLES.items() for path in _paths(job)]


@st.composite
def mutated_examples(draw):
    name, path = draw(st.sampled_from(EXAMPLE_PATHS))
    job = copy.deepcopy(EXAMPLES[name])
    node = job
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = draw(values)
    return name, job


@fuzz(80)
@given(case=mutated_examples())
def test_fuzzed_example_jobs_parse_or_say_why(tmp_path_factory, case):
    """examples/*.yaml with one field (or section) given a value of the wrong type or shape.
    What is fuzzed is reading and checking the job, so the trace itself is stubbed out (a job
    that gets through is exit 0)."""
    name, job = case
    path = tmp_path_factory.mktemp("fz") / name
    path.write_text(yaml.safe_dump(job))
    argv = ["estimate", str(path)]
    with mock.patch("trainplan.estimate.estimate", side_effect=_Validated):
        assert_clean(*run_cli(argv), argv)


TINY_JOB_FIELDS = {"batch_size": 2, "grad_accum": 1, "seq_len": 32, "precision": "fp16",
                   "optimizer": "adamw", "grad_checkpointing": "none", "attention": "auto",
                   "lora": {"rank": 4, "alpha": 8, "targets": "c_attn"}, "gpus": 1,
                   "strategy": "single", "notes": ["a note"], "frozen": [], "name": "tiny"}


@fuzz(8)
@given(key=st.sampled_from(sorted(TINY_JOB_FIELDS)), value=values)
def test_fuzzed_small_job_end_to_end(tiny_config, tmp_path_factory, key, value):
    """A tiny job with one field fuzzed, estimated for real (parsing, tracing and the report)."""
    job = {"model": f"hf:{tiny_config}", "gpu": "t4", **TINY_JOB_FIELDS, key: value}
    path = tmp_path_factory.mktemp("fz") / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    argv = ["estimate", str(path)]
    assert_clean(*run_cli(argv), argv)


@pytest.mark.parametrize("text, says", [
    ("model: {hidden_size: 64, num_layers: 1, num_heads: 4}\ntransformer: abc\n", "transformer"),
    ("model: hf:openai-community/gpt2\ntraining_data: 1.5\n", "training_data must be a mapping"),
    ("model: {hidden_size: 64, num_layers: 100000, num_heads: 4}\n", "num_layers 100000 is more"),
    ("model: hf:openai-community/gpt2\nrun: fp16\n", "run must be a mapping"),
    ("model: hf:openai-community/gpt2\nlora: {rank: '---'}\n", "rank must be a whole number"),
    ("model: hf:openai-community/gpt2\nnotes: 5\n", "notes must be text or a list"),
    ("model: hf:openai-community/gpt2\nbatch_size: abc\n", "batch_size must be a whole number"),
    ("model: hf:openai-community/gpt2\nseq_len: 1.5\n", "seq_len must be a whole number"),
    ("model: [hf:openai-community/gpt2]\n", "model must be a name or a mapping"),
    ("model: py:m.py:build\ninputs: 5\n", "inputs must be a list"),
    ("model: py:m.py:build\ninputs: [{shape: [batch, '---']}]\n", "inputs[0] shape"),
    ("model: hf:openai-community/gpt2\ncheckpointing: [full]\n", "checkpointing must be a mapping"),
    ("model: hf:openai-community/gpt2\nmoe_capacity_factor: big\n",
     "moe_capacity_factor must be a number"),
])
def test_wrong_shapes_in_a_job_file(tmp_path, text, says):
    path = tmp_path / "job.yaml"
    path.write_text(text + "gpu: t4\n")
    code, err = run_cli(["estimate", str(path)])
    assert code == 2 and says in err and str(path) in err, err
    assert err.startswith("trainplan: error:") and "To fix" in err


def test_a_wrong_shape_names_its_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: hf:openai-community/gpt2\ngpu: t4\nbatch_size: [4]\n")
    code, err = run_cli(["estimate", str(path)])
    assert code == 2 and f"{path}, line 3: batch_size" in err, err


# -- command-line flags ------------------------------------------------------------------------

FLAG_VALUES = {
    "--gpu": st.sampled_from(["t4", "a100-sxm4-80gb", "T4", "a100", "", "tpu-v5e-8", "h100"]),
    "--gpus": st.integers(-2, 9).map(str),
    "--batch-size": st.one_of(st.integers(-2, 64).map(str), st.just("x")),
    "--grad-accum": st.integers(-1, 8).map(str),
    "--seq-len": st.one_of(st.integers(-1, 200).map(str), st.just("1.5")),
    "--precision": st.sampled_from(["fp16", "bf16", "fp32", "fp8", "amp", "16", "", "pure-bf16"]),
    "--optimizer": st.sampled_from(["adamw", "sgd", "adam_w", "AdamW8bit", "lion", "x"]),
    "--strategy": st.sampled_from(["ddp", "zero3", "fsdp", "zero9", "dp"]),
    "--grad-checkpointing": st.sampled_from(["none", "full", "selective", "some"]),
    "--checkpoint-impl": st.sampled_from(["auto", "reentrant", "non-reentrant", "x"]),
    "--lora-rank": st.integers(-1, 16).map(str),
    "--lora-targets": st.sampled_from(["c_attn", "all-linear", "q,v", "nothing_here", ""]),
    "--quantize": st.sampled_from(["nf4", "int8", "none", "fp4", "q"]),
    "--expert-parallel": st.integers(-1, 4).map(str),
    "--moe-capacity-factor": st.sampled_from(["1.25", "0.5", "-1", "x", "nan"]),
    "--task": st.sampled_from(["causal-lm", "masked-lm", "seq2seq", "image-classification", "x"]),
    "--attention": st.sampled_from(["auto", "eager", "flash", "math", "fast"]),
}


@fuzz(8)
@given(flags=st.lists(st.sampled_from(sorted(FLAG_VALUES)), min_size=1, max_size=3,
                      unique=True).flatmap(
    lambda names: st.tuples(*[st.tuples(st.just(n), FLAG_VALUES[n]) for n in names])))
def test_fuzzed_flags(tiny_config, flags):
    argv = ["estimate", "--model", f"hf:{tiny_config}", "--gpu", "t4", "--seq-len", "32"]
    for name, value in flags:
        argv += [name, value]
    assert_clean(*run_cli(argv), argv)


# -- a failing command leaves an existing --report file alone -----------------------------------

@fuzz(10)
@given(case=mutated_examples(), ext=st.sampled_from([".md", ".json", ".html"]))
def test_failed_plan_does_not_clobber_the_report(tmp_path_factory, case, ext):
    name, job = case
    folder = tmp_path_factory.mktemp("fz")
    path, report = folder / name, folder / f"plan{ext}"
    path.write_text(yaml.safe_dump(job))
    report.write_text("an earlier report\n")
    argv = ["plan", str(path), "--report", str(report), "--force"]
    with mock.patch("trainplan.plan.make_plan", side_effect=_Validated):
        code, err = run_cli(argv)
    assert_clean(code, err, argv)
    assert report.read_text() == "an earlier report\n"
    assert sorted(os.listdir(folder)) == sorted([name, report.name])    # no temp files left


def test_report_kept_when_writing_fails(tiny_config, tmp_path):
    """The report replaces the old file only once it is whole: a write that fails part-way
    (here: the disk fills up before the data is on it) leaves the earlier file, and no
    temporary file, behind; the command says why and exits 2."""
    report = tmp_path / "plan.md"
    report.write_text("an earlier report\n")
    argv = ["plan", "--model", f"hf:{tiny_config}", "--seq-len", "32", "--platforms",
            "kaggle-t4x2", "--steps", "10", "--report", str(report), "--force"]
    with mock.patch("trainplan.paths.os.fsync", side_effect=OSError(28, "No space left on device")):
        code, err = run_cli(argv)
    assert code == 2 and "cannot write --report" in err and "No space left" in err, err
    assert report.read_text() == "an earlier report\n"
    assert os.listdir(tmp_path) == ["plan.md"]


# -- exports: --out paths, names, job files, huge numbers (issue 40) ------------------------------

EXPORT_JOB = {"name": "tiny", "model": "transformer", "transformer": {
    "hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128,
    "vocab_size": 256, "kind": "decoder"}, "batch_size": 4, "seq_len": 32, "steps": 50}


@pytest.fixture(scope="module")
def export_job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("exp") / "job.yaml"
    path.write_text(yaml.safe_dump(EXPORT_JOB))
    return path


OUT_PARTS = ["", " ", "a", "..", ".", "x" * 260, "-", "--to", "a\nb", "é", "a b", "*", "$(x)",
             "\0", "job.yaml", "~"]


@fuzz(12)
@given(parts=st.lists(st.sampled_from(OUT_PARTS), min_size=1, max_size=3))
def test_fuzzed_export_out(export_job, tmp_path_factory, parts):
    """--out made of odd parts under a fresh folder: exit 0, or exit 2 and nothing written."""
    base = tmp_path_factory.mktemp("out")
    out = str(base) + "/" + "/".join(parts)
    argv = ["export", str(export_job), "--platform", "kaggle-t4x2", "--to", "torchrun",
            "--out", out]
    code, err = run_cli(argv)
    assert_clean(code, err, argv)
    if code == 2:
        assert os.listdir(base) == [], (parts, os.listdir(base))


@pytest.fixture(scope="module")
def kaggle_launch(export_job):
    from trainplan.export import launch_from_plan
    from trainplan.plan import make_plan, select_platforms
    from trainplan.jobfile import load_job
    job = load_job(str(export_job))
    plan = make_plan(job, select_platforms(["kaggle-t4x2"]))
    return launch_from_plan(plan, plan.platforms[0], job, job_file=str(export_job))


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=40) | \
    st.sampled_from(["demo\ntouch PWNED", "$(reboot)", "`id`", "a'b\"c", "\u2028x", "-", "#"])


@fuzz(10)
@given(name=names)
def test_fuzzed_job_names_are_data_in_every_format(kaggle_launch, tmp_path_factory, name):
    """Any job name: every file still parses in its format and every script passes bash -n
    (shellcheck too where installed: tests/test_export_safety.py)."""
    import dataclasses
    import shutil
    import subprocess
    from trainplan.export import render
    from test_export_safety import check_formats
    files = render(dataclasses.replace(kaggle_launch, job_name=name), "all", spot=True)
    check_formats(files)
    tmp = tmp_path_factory.mktemp("sh")
    sc = shutil.which("shellcheck")
    for fname, text in files.items():
        if fname.endswith((".sh", ".sbatch")):
            f = tmp / fname.replace("/", "_")
            f.write_text(text)
            assert subprocess.run(["bash", "-n", str(f)]).returncode == 0, (name, fname)
            if sc:
                r = subprocess.run([sc, str(f)], capture_output=True, text=True)
                assert r.returncode == 0, (name, fname, r.stdout)
            if fname.endswith(".sbatch"):       # one directive line, one word after it
                job = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --job-name="))
                assert len(job.split("=", 1)[1].split()) == 1, (name, job)


@pytest.mark.parametrize("make, says", [
    (lambda p: p.mkdir(), "is a folder"),
    (lambda p: p.write_bytes(bytes(range(256)) * 8), "is not text"),
    (lambda p: p.write_text(""), "No model given"),
    (lambda p: p.write_text("- a\n- b\n"), "must be a YAML mapping"),
    (lambda p: p.write_text(yaml.safe_dump({**EXPORT_JOB, "steps": 10**30})), "out of range"),
    (lambda p: p.write_text(yaml.safe_dump({**EXPORT_JOB, "steps": 0})), "positive whole"),
    (lambda p: p.write_text(yaml.safe_dump({**EXPORT_JOB, "name": ["x"]})), "name must be"),
])
def test_export_job_files_of_every_kind(tmp_path, make, says):
    path = tmp_path / "job.yaml"
    make(path)
    argv = ["export", str(path), "--platform", "kaggle-t4x2", "--to", "kaggle", "--out",
            str(tmp_path / "o")]
    code, err = run_cli(argv)
    assert_clean(code, err, argv)
    assert code == 2 and says in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["plan", "export"])
@pytest.mark.parametrize("steps", ["1e30", str(10**30), "inf", "nan", "-3", "2.5", "0x10"])
def test_huge_and_odd_step_counts(export_job, tmp_path, command, steps):
    """`--steps 1e30` says it is out of range (it planned 2.2e25 sessions)."""
    argv = [command, str(export_job), "--steps", steps]
    argv += (["--platform", "kaggle-t4x2", "--to", "torchrun", "--out", str(tmp_path / "o")]
             if command == "export" else ["--platforms", "kaggle-t4x2"])
    code, err = run_cli(argv)
    assert_clean(code, err, argv)
    assert code == 2
    if steps in ("1e30", str(10**30), "inf"):
        assert "out of range" in err, err


def test_a_model_name_too_long_for_a_path(tmp_path):
    """A 100+-character hf: name was used as a file path: OSError 'File name too long'."""
    argv = ["estimate", "--model", "hf:" + "a" * 300, "--gpu", "t4"]
    code, err = run_cli(argv)
    assert_clean(code, err, argv)
    assert code == 2 and "Unknown model" in err


def test_config_fields_are_read_from_transformers_once(tmp_path, monkeypatch):
    # a local config's fields are checked against transformers' config class; the class's
    # fields are kept in the cache folder by transformers' release, so a later run checks them
    # without importing transformers (and PyTorch)
    from trainplan.errors import TrainplanError
    from trainplan.models import hf_validate
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path))
    first = hf_validate._config_fields("llama")
    assert {"hidden_size", "num_hidden_layers", "num_attention_heads"} <= first
    assert hf_validate._config_fields("no-such-family") is None
    assert len(list((tmp_path / "cache").glob("*-config_fields.json"))) == 1

    def unread(model_type):
        raise AssertionError(f"read transformers again for {model_type}")
    monkeypatch.setattr(hf_validate, "_read_config_fields", unread)
    assert hf_validate._config_fields("llama") == first
    assert hf_validate._config_fields("no-such-family") is None
    with pytest.raises(TrainplanError, match="does not match the config's fields"):
        hf_validate.check_fields_match({"model_type": "llama", "n_embd": 64, "n_layer": 2},
                                       "config.json")
