"""`trainplan export --to axolotl | llama-factory | trl | torchtune`: a real config of each
framework, planned on one platform and exported, reads back as the job the plan runs (the
platform's adaptations and kept fix-ladder rungs included); every key written is one the
framework's schema knows; the user's own config is never written over."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from trainplan import configs
from trainplan.cli.main import main
from trainplan.configs.common import known_keys
from trainplan.export import launch_from_plan, render, write
from trainplan.export.frameworks import Export, final_job
from trainplan.plan import make_plan
from trainplan.plan.planner import platform_job
from trainplan.platforms import select_platforms
from trainplan.spec import validate

DATA = Path(__file__).parent / "data" / "configs"
FIELDS = ("model", "batch_size", "grad_accum", "seq_len", "precision", "optimizer",
          "grad_checkpointing", "reentrant_checkpointing", "attention", "lora", "quantize",
          "strategy", "offload", "algorithm", "rollout", "gpus", "sync_each_batch", "max_grad_norm")
NAMES = {"axolotl": "axolotl.yaml", "llama-factory": "llama_factory.yaml",
         "trl": "trl_config.yaml", "torchtune": "torchtune.yaml"}


@pytest.fixture(autouse=True)
def _from_repo_root(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])


def unclipped_axolotl(kind: str, diff: dict, text: str) -> None:
    """axolotl passes only a non-zero max_grad_norm on, so a plan without clipping reads back
    clipped to the Trainer's 1.0: the one difference allowed, and only with the header's note."""
    if kind == "axolotl" and diff.get("max_grad_norm") == (None, 1.0):
        assert "passes only a non-zero max_grad_norm" in " ".join(text.replace("#", " ").split())
        diff.pop("max_grad_norm")


def planned(cfg: str, platform: str, steps: int | None = 50):
    """(Export of the plan for `platform`, the platform): the job the plan runs there."""
    job, reading = configs.load(cfg)
    job = validate(job.with_(steps=steps) if steps else job)
    plats = select_platforms([platform])
    plan = make_plan(job, plats)
    pp = plan.platforms[0]
    ln = launch_from_plan(plan, pp, job, job_file=cfg)
    return Export(ln, final_job(job, plats[0], pp), reading, steps), plats[0]


def read_back(e: Export, platform, kind: str, out: Path):
    """(the files written, the job read back from them as the same platform runs it, the
    reading)."""
    files = render(e.ln, kind, framework=e)
    write(files, out)
    back, reading_back = configs.load(str(out / NAMES[kind]))
    back = platform_job(validate(back), platform)[0]        # the same platform's adaptations
    return files, back, reading_back


def exported(cfg: str, kind: str, platform: str, out: Path, steps: int | None = 50):
    """(the planned job, the job read back from the export, the files, the reading)."""
    e, plat = planned(cfg, platform, steps)
    files, back, reading_back = read_back(e, plat, kind, out)
    return e.job, back, files, reading_back


def same(a, b) -> dict:
    return {f: (getattr(a, f), getattr(b, f)) for f in FIELDS if getattr(a, f) != getattr(b, f)}


@pytest.mark.parametrize("cfg, kind, platform", [
    ("axolotl/axolotl/examples/qwen2/dpo.yaml", "axolotl", "aws-p5.4xlarge"),
    ("llama-factory/LLaMA-Factory/examples/train_lora/llama3_lora_sft.yaml", "llama-factory",
     "aws-p5.4xlarge"),
    ("trl/trl/examples/cli_configs/example_config.yaml", "trl", "aws-p5.4xlarge"),
    ("torchtune/torchtune/recipes/configs/qwen2_5/0.5B_full_single_device.yaml", "torchtune",
     "aws-p5.4xlarge"),
])
def test_round_trip(cfg, kind, platform, tmp_path):
    planned, back, files, reading = exported(f"tests/data/configs/{cfg}", kind, platform,
                                             tmp_path)
    assert not same(planned, back)
    assert reading.kind == kind
    assert reading.settings.get("steps") in (50, None) or kind == "torchtune"


def test_round_trip_across_frameworks(tmp_path):
    """A torchtune LoRA recipe, exported as every other framework's config, plans the same."""
    e, plat = planned("tests/data/configs/torchtune/torchtune/recipes/configs/llama3_2/"
                      "1B_lora_single_device.yaml", "aws-p5.4xlarge")
    for kind in ("axolotl", "llama-factory", "trl"):
        files, back, _r = read_back(e, plat, kind, tmp_path / kind)
        diff = same(e.job, back)
        unclipped_axolotl(kind, diff, files[NAMES[kind]])
        if kind == "llama-factory":   # LLaMA-Factory's lora_target names modules, not roles
            diff.pop("lora", None)
        assert not diff, (kind, diff)


def test_grpo_round_trip_through_trl(tmp_path):
    planned, back, files, _r = exported(
        "tests/data/configs/trl/open-r1/recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml",
        "trl", "aws-p4de.24xlarge", tmp_path)
    assert planned.rollout == back.rollout and not same(planned, back)
    text = files["trl_config.yaml"]
    assert "launch: accelerate launch --num_processes 8 trl grpo --config" in text


def test_zero3_writes_a_deepspeed_config_the_export_reads_back(tmp_path):
    """A ZeRO plan's framework config names ds_config.json, written beside it, its batch
    fields "auto" (filled from the framework's own, as the HF Trainer does)."""
    planned, back, files, reading = exported(
        "tests/data/configs/llama-factory/LLaMA-Factory/examples/train_full/llama3_full_sft.yaml",
        "llama-factory", "aws-p4de.24xlarge", tmp_path)
    assert "ds_config.json" in files and planned.strategy.name == "zero3"
    assert not same(planned, back)
    assert [c.kind for c in reading.companions] == ["deepspeed"]


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory):
    """A trainplan job (no framework config), planned once for the module."""
    job_file = tmp_path_factory.mktemp("tiny") / "job.yaml"
    job_file.write_text("name: tiny\nmodel: hf:Qwen/Qwen2.5-0.5B\nbatch_size: 2\nseq_len: 256\n"
                        "precision: bf16\nlora: {rank: 8, alpha: 16, targets: all-linear}\n"
                        "steps: 20\n")
    return planned(str(job_file), "aws-p5.4xlarge", 20)


@pytest.mark.parametrize("kind", sorted(NAMES))
def test_written_keys_are_the_frameworks(kind, tiny_plan, tmp_path):
    """From a trainplan job (no source config), every top-level key written is one the
    framework's schema defines (data/config_keys/<kind>.json), and it reads back the same."""
    e, plat = tiny_plan
    files, back, _r = read_back(e, plat, kind, tmp_path)
    diff = same(e.job, back)
    unclipped_axolotl(kind, diff, files[NAMES[kind]])
    if kind == "torchtune":          # all-linear is written as torchtune's module flags
        diff.pop("lora", None)
    assert not diff, diff
    data = yaml.safe_load(files[NAMES[kind]])
    keys, _ = known_keys({"axolotl": "axolotl", "llama-factory": "llama-factory", "trl": "trl",
                          "torchtune": "torchtune"}[kind])
    assert set(data) <= set(keys), set(data) - set(keys)
    assert "REPLACE_WITH" in files[NAMES[kind]]          # the dataset to fill in is named


def test_export_never_writes_over_the_config_it_read(tmp_path, capsys):
    cfg = tmp_path / "axolotl.yaml"
    shutil.copy(DATA / "axolotl/axolotl/examples/qwen2/dpo.yaml", cfg)
    before = cfg.read_text()
    rc = main(["export", str(cfg), "--gpu", "h100-sxm", "--to", "axolotl", "--out",
               str(tmp_path), "--steps", "10"])
    err = capsys.readouterr().err
    assert rc == 2 and "the file this plan was read from" in err
    assert cfg.read_text() == before


def test_export_cli_writes_the_framework_config(tmp_path, capsys):
    rc = main(["export", "tests/data/configs/axolotl/axolotl/examples/qwen2/dpo.yaml", "--gpu",
               "h100-sxm", "--to", "trl", "--out", str(tmp_path), "--steps", "10"])
    out, err = capsys.readouterr()
    assert rc == 0 and err.startswith("read from axolotl")
    text = (tmp_path / "trl_config.yaml").read_text()
    assert text.startswith("# Generated by `trainplan export`")
    data = yaml.safe_load(text)
    assert data["model_name_or_path"] == "Qwen/Qwen2.5-0.5B" and data["max_steps"] == 10
    assert (tmp_path / "trainplan-plan.json").exists()


@pytest.mark.parametrize("kind, match", [
    ("llama-factory", "LLaMA-Factory has no GRPO stage"),
    ("torchtune", "torchtune has no GRPO recipe"),
])
def test_what_a_framework_cannot_run_is_refused(kind, match, tmp_path, capsys):
    job_file = tmp_path / "grpo.yaml"
    job_file.write_text("model: hf:Qwen/Qwen2.5-0.5B\nalgorithm: grpo\nbatch_size: 2\n"
                        "rollout: {generations: 2, prompt_len: 128, completion_len: 64}\n"
                        "precision: bf16\nsteps: 5\n")
    rc = main(["export", str(job_file), "--gpu", "h100-sxm", "--to", kind, "--out",
               str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["trl", "axolotl", "llama-factory"])
@pytest.mark.parametrize("model, built", [
    ("hf:google-bert/bert-base-uncased", "BertForMaskedLM"),
    ("hf:google-t5/t5-small", "T5ForConditionalGeneration"),
])
def test_a_model_a_causal_lm_framework_cannot_train_is_refused(kind, model, built, tmp_path,
                                                               capsys):
    """axolotl, LLaMA-Factory and TRL load causal (or vision-language) models: a BERT masked LM
    or a T5 seq2seq plan is not written as their config, which would train another head or
    stop; nothing is written."""
    rc = main(["export", "--model", model, "--seq-len", "64", "--batch-size", "2", "--gpu",
               "h100-sxm", "--steps", "5", "--to", kind, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and f"trains {model[3:]} as {built}" in err, err
    assert "export --to torchrun" in err and not (tmp_path / "out").exists()
