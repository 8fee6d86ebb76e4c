"""Framework configs (configs/): real axolotl, LLaMA-Factory, TRL, torchtune, DeepSpeed and
accelerate files from those projects' repositories (tests/data/configs/SOURCES.md) are read into
trainplan's job, what each key became is shown (goldens in tests/golden/configs/), every one
plans, each framework's config round-trips through `export --to <framework>`, an unknown key is
listed, and bad input is one clear message.

Refresh the goldens on purpose only: python -m pytest tests/test_configs.py --update-golden
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from trainplan import configs
from trainplan.cli.main import main
from trainplan.configs.common import known_keys
from trainplan.errors import TrainplanError
from trainplan.spec import validate

DATA = Path(__file__).parent / "data" / "configs"
GOLDEN = Path(__file__).parent / "golden" / "configs"
CONFIGS = sorted(p for p in DATA.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
# real configs naming a model trainplan does not bundle (a fine-tune, a newer TinyLlama): they
# plan with --model, and without it say which model is missing (test below)
NOT_BUNDLED = {"axolotl/axolotl/examples/archived/tiny-llama/lora.yml":
               "hf:TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
               "trl/alignment-handbook/recipes/zephyr-7b-beta/dpo/config_full.yaml":
               "hf:mistralai/Mistral-7B-v0.1"}


def rel(p: Path) -> str:
    return p.relative_to(DATA).as_posix()


@pytest.fixture
def update(request) -> bool:
    return bool(request.config.getoption("--update-golden")
                or os.environ.get("TRAINPLAN_UPDATE_GOLDEN") == "1")


@pytest.fixture(autouse=True)
def _from_repo_root(monkeypatch):
    """Paths in the readings are shown relative to the current folder: the repository root."""
    monkeypatch.chdir(Path(__file__).parents[1])


def test_enough_real_configs_per_framework():
    kinds = {}
    for p in CONFIGS:
        kinds.setdefault(configs.detect(configs.common.load_file(p), str(p)), []).append(p)
    assert {k: len(v) >= 5 for k, v in kinds.items()} == {
        k: True for k in ("axolotl", "llama-factory", "trl", "torchtune", "deepspeed",
                          "accelerate")}, {k: len(v) for k, v in kinds.items()}
    sources = (DATA / "SOURCES.md").read_text()
    assert all(rel(p) in sources for p in CONFIGS), "every config names its source and commit"


@pytest.mark.parametrize("path", CONFIGS, ids=rel)
def test_read_fields_match_golden(path, update):
    """What every key of a real config became: the golden is the output's reading block."""
    _job, reading = configs.load(str(path.relative_to(Path.cwd())))
    text = "\n".join(reading.lines()) + "\n"
    assert all(len(line) <= 80 for line in text.splitlines()), "fits an 80-column terminal"
    golden = GOLDEN / (rel(path) + ".txt")
    if update or not golden.exists():
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def _planned(path: Path):
    """The config's job as `estimate CONFIG --gpu h100-sxm` runs it: a model where the file
    names none (DeepSpeed / accelerate alone: a small transformer) or an unbundled one
    (--model), and --gpus 8 where it shards over devices it does not count."""
    from trainplan.models.dims import TransformerDims
    job, reading = configs.load(str(path))
    over = {"gpu": "h100-sxm"}
    if rel(path) in NOT_BUNDLED:
        over["model"] = NOT_BUNDLED[rel(path)]
    elif job.model == "transformer":      # DeepSpeed / accelerate alone: a small transformer
        over.update(transformer=TransformerDims(hidden_size=256, num_layers=4, num_heads=4,
                                                vocab_size=1024, kind="decoder"), seq_len=128)
    if job.strategy.sharded and job.gpus == 1:
        over["gpus"] = 8
    return validate(job.with_(**over)), reading


@pytest.mark.parametrize("path", CONFIGS, ids=rel)
def test_every_config_plans(path):
    """Each real config is a job the prediction core evaluates (one accelerator, no batch
    search: the plan itself is covered by the CLI tests below)."""
    from trainplan.accelerators import get_accelerator
    from trainplan.estimate import estimate
    job, reading = _planned(path)
    est = estimate(job, get_accelerator("h100-sxm"), with_max_batch=False)
    assert est.memory.peak_allocated_bytes > 0 and est.time.step_time_s > 0
    assert any(reading.note() in n for n in est.trace.notes) or reading.kind == "trainplan"


@pytest.mark.parametrize("name", ["axolotl/axolotl/examples/llama-3/lora-1b.yml",
                                  "torchtune/torchtune/recipes/configs/qwen2_5/"
                                  "0.5B_full_single_device.yaml"])
def test_plan_cli_exit_0_shows_the_reading(name, capsys):
    rc = main(["plan", f"tests/data/configs/{name}", "--platforms", "aws-p5.4xlarge", "-q"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("read from ")
    assert "micro-batch" in out.split("\n\n")[0]
    assert "planned 1,000 optimizer steps" in out       # no dataset size: per 1,000 steps


def test_unknown_key_is_listed(tmp_path, capsys):
    """A key axolotl does not know (a typo) is listed in the output, not dropped."""
    cfg = tmp_path / "mine.yml"
    cfg.write_text("base_model: Qwen/Qwen2.5-0.5B\nsequence_len: 512\nmicro_batch_size: 2\n"
                   "micro_batch_sise: 8\ndatasets: [{path: x, type: alpaca}]\n")
    job, reading = configs.load(str(cfg))
    assert reading.unknown == ["micro_batch_sise"] and job.batch_size == 2
    rc = main(["estimate", str(cfg), "--gpu", "h100-sxm", "-q"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "unknown keys (not axolotl's, nor trainplan's; ignored): micro_batch_sise" in out
    assert "unknown keys: micro_batch_sise" in out.replace("\n", " ")     # and in the notes


def test_estimate_json_carries_the_reading(capsys):
    rc = main(["estimate", "tests/data/configs/axolotl/axolotl/examples/qwen2/dpo.yaml", "--gpu",
               "h100-sxm", "--format", "json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)                         # stdout stays JSON: the reading went to stderr
    assert rc == 0 and err.startswith("read from axolotl")
    reading = doc["config_reading"]
    assert reading["kind"] == "axolotl"
    assert {"key": "micro_batch_size", "value": 2, "meaning": "micro-batch 2"} in reading["read"]


def test_unknown_key_in_a_nested_section_is_named_dotted(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "stagee": 3},
                              "train_micro_batch_size_per_gpu": 2}))
    _job, reading = configs.load(str(ds))
    assert reading.unknown == ["zero_optimization.stagee"]


def test_every_key_is_accounted_for():
    """Each key of each real config is read, named as not modelled, listed as without effect
    or as unknown: none is dropped."""
    for path in CONFIGS:
        data = configs.common.load_file(path)
        _job, reading = configs.load(str(path))
        named = {f.key.split(".")[0] for f in reading.read + reading.unmodelled}
        named |= {k.split(".")[0] for k in reading.ignored + reading.unknown}
        missing = {k for k, v in data.items() if v is not None} - named
        assert not missing, (rel(path), missing)


# --- what is read, checked against the frameworks' own rules -----------------------------------

def test_deepspeed_auto_is_filled_from_the_training_config():
    """LLaMA-Factory's ds_z3 config is all "auto": the HF Trainer fills micro-batch and
    accumulation from per_device_train_batch_size / gradient_accumulation_steps and bf16 from
    bf16 (transformers HfTrainerDeepSpeedConfig.trainer_config_process)."""
    job, reading = configs.load(str(DATA / "llama-factory/LLaMA-Factory/examples/train_full/"
                                           "llama3_full_sft.yaml"))
    ds = reading.companions[0]
    assert ds.kind == "deepspeed"
    assert (job.batch_size, job.grad_accum, job.strategy.name, job.precision.name) == (
        1, 2, "zero3", "bf16-amp")
    assert any("\"auto\": 1, the micro-batch of LLaMA-Factory" in a for a in ds.assumed)


def test_deepspeed_value_that_contradicts_the_trainer_is_refused(tmp_path):
    """The HF Trainer refuses a DeepSpeed value that differs from its own (fill_match)."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2},
                              "train_micro_batch_size_per_gpu": 4}))
    cfg = tmp_path / "lf.yaml"
    cfg.write_text(f"model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: full\n"
                   f"per_device_train_batch_size: 2\ndeepspeed: {ds}\n")
    with pytest.raises(TrainplanError, match="train_micro_batch_size_per_gpu: 4 while"):
        configs.load(str(cfg))


def test_deepspeed_16_bit_mode_that_contradicts_the_trainer_is_refused(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}))
    cfg = tmp_path / "axolotl.yml"
    cfg.write_text(f"base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 2\nbf16: true\n"
                   f"deepspeed: {ds}\ndatasets: [{{path: x, type: alpaca}}]\n")
    with pytest.raises(TrainplanError, match="fp16.enabled: true while axolotl sets fp16 off"):
        configs.load(str(cfg))


def test_deepspeed_flag_over_a_trainplan_job_wins(tmp_path):
    """--deepspeed is given on the command line: its explicit values go over the job file's."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text("model: hf:Qwen/Qwen2.5-0.5B\nbatch_size: 2\nprecision: fp32\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                              "train_micro_batch_size_per_gpu": 4}))
    job, _ = configs.load(str(job_file), deepspeed=str(ds))
    assert (job.batch_size, job.precision.name, job.strategy.name) == (4, "bf16-amp", "zero3")


def test_deepspeed_batch_triple_gives_the_world_size(tmp_path):
    """DeepSpeed checks train_batch_size = micro x accumulation x world size: all three pin the
    devices (DeepSpeedConfig._set_batch_related_parameters)."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 2,
                              "zero_optimization": {"stage": 1}, "fp16": {"enabled": True}}))
    job, _ = configs.load(str(ds))
    assert (job.gpus, job.batch_size, job.grad_accum, job.strategy.name, job.precision.name) == (
        8, 4, 2, "zero1", "fp16-amp")
    ds.write_text(json.dumps({"train_batch_size": 64, "zero_optimization": {"stage": 0}}))
    job, _ = configs.load(str(ds))                 # alone: accumulation 1, micro = tbs / world
    assert (job.batch_size, job.grad_accum) == (64, 1)


def test_deepspeed_and_accelerate_beside_a_trainplan_job(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("model: hf:Qwen/Qwen2.5-0.5B\nbatch_size: 2\nseq_len: 256\n"
                        "precision: bf16-amp\n")
    ds = DATA / "axolotl/axolotl/deepspeed_configs/zero2.json"
    acc = DATA / "accelerate/trl/examples/accelerate_configs/multi_gpu.yaml"
    job, reading = configs.load(str(job_file), deepspeed=str(ds), accelerate=str(acc))
    assert (job.strategy.name, job.offload, job.gpus, job.batch_size) == ("zero2", "optimizer",
                                                                          8, 2)
    assert [c.kind for c in reading.companions] == ["deepspeed", "accelerate"]
    assert reading.lines()[0].startswith("read from DeepSpeed")


def test_accelerate_fsdp_offload():
    job, _ = configs.load(str(DATA / "llama-factory/LLaMA-Factory/examples/accelerate/"
                                     "fsdp_config_offload.yaml"))
    assert (job.strategy.name, job.offload, job.gpus, job.precision.name) == (
        "fsdp", "optimizer+params", 2, "bf16-amp")


@pytest.mark.parametrize("name, want", [
    ("axolotl/axolotl/examples/llama-3/qlora-1b.yml",
     dict(model="hf:meta-llama/Llama-3.2-1B", batch_size=2, grad_accum=4, seq_len=2048,
          precision="bf16", optimizer="adamw-8bit", quantize="nf4-dq", attention="flash",
          checkpoint_impl="non-reentrant")),
    ("llama-factory/LLaMA-Factory/examples/train_qlora/llama3_lora_sft_otfq.yaml",
     dict(model="hf:meta-llama/Meta-Llama-3-8B-Instruct", batch_size=1, grad_accum=8,
          seq_len=2048, precision="bf16", quantize="nf4-dq", grad_checkpointing="full",
          checkpoint_impl="reentrant", dataset_size=2000)),
    ("trl/open-r1/recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml",
     dict(model="hf:Qwen/Qwen2.5-1.5B-Instruct", algorithm="grpo", batch_size=16,
          precision="bf16")),
    ("torchtune/torchtune/recipes/configs/llama3_1/8B_lora.yaml",
     dict(model="hf:meta-llama/Llama-3.1-8B", strategy="fsdp", gpus=2, precision="bf16")),
])
def test_fields_read(name, want):
    job, _ = configs.load(str(DATA / name))
    got = {k: getattr(job, k) for k in want}
    got = {k: getattr(v, "name", v) for k, v in got.items()}
    assert got == want


def test_llamafactory_freeze_trains_the_last_blocks(tmp_path):
    """finetuning_type freeze: the last freeze_trainable_layers blocks train, everything else
    (embeddings, final norm, the other blocks) is frozen (LLaMA-Factory adapter.py
    _setup_freeze_tuning); the prefixes are the built model's own (the trace checks them)."""
    from trainplan.accelerators import get_accelerator
    from trainplan.estimate import estimate
    cfg = tmp_path / "freeze.yaml"
    cfg.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: freeze\n"
                   "freeze_trainable_layers: 2\ncutoff_len: 256\nper_device_train_batch_size: 2\n"
                   "bf16: true\n")
    job, _ = configs.load(str(cfg))
    assert "model.layers.21" in job.frozen and "model.layers.22" not in job.frozen
    est = estimate(validate(job.with_(gpu="h100-sxm")), get_accelerator("h100-sxm"),
                   with_max_batch=False)
    assert 0 < est.trace.params_trainable < est.trace.params_total / 5


def test_axolotl_grpo_rollout(tmp_path):
    cfg = tmp_path / "grpo.yml"
    cfg.write_text("base_model: Qwen/Qwen2.5-0.5B\nrl: grpo\nsequence_len: 1024\n"
                   "micro_batch_size: 4\ntrl: {num_generations: 4, max_completion_length: 256, "
                   "beta: 0.04, use_vllm: true, vllm_mode: colocate}\n"
                   "vllm: {gpu_memory_utilization: 0.4}\ndatasets: [{path: x, type: y}]\n")
    job, reading = configs.load(str(cfg))
    r = validate(job).rollout
    assert (r.generations, r.prompt_len, r.completion_len, r.beta, r.engine,
            r.gpu_memory_utilization) == (4, 768, 256, 0.04, "vllm-colocate", 0.4)
    assert not reading.unknown


def test_grpo_rollout_from_trl():
    job, _ = configs.load(str(DATA / "trl/open-r1/recipes/Qwen2.5-1.5B-Instruct/grpo/"
                                     "config_demo.yaml"))
    r = job.rollout
    assert (r.generations, r.prompt_len, r.completion_len, r.engine, r.beta) == (
        16, 512, 1024, "vllm-colocate", 0.0)
    assert validate(job).seq_len == 512 + 1024


def test_lora_targets_from_torchtune_and_axolotl():
    job, _ = configs.load(str(DATA / "torchtune/torchtune/recipes/configs/llama3_2/"
                                     "1B_qlora_single_device.yaml"))
    assert job.lora.targets == "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    assert job.quantize.name == "torchao-nf4" and (job.lora.rank, job.lora.alpha) == (64, 128)
    job, _ = configs.load(str(DATA / "axolotl/axolotl/examples/mistral/qlora.yml"))
    assert job.lora.targets == "all-linear"               # lora_target_linear wins


def test_keys_lists_name_their_sources():
    for kind in ("axolotl", "llama-factory", "trl", "torchtune", "deepspeed", "accelerate"):
        from importlib import resources
        doc = json.loads((resources.files("trainplan") / "data" / "config_keys" /
                          f"{kind}.json").read_text())
        assert doc["sources"] and all("commit" in s or "version" in s for s in doc["sources"])
        keys, _ = known_keys(kind)
        assert len(keys) > 40


# --- bad input: one message, exit 2 ------------------------------------------------------------

def test_unbundled_model_names_the_file_and_close_matches(capsys):
    path = DATA / "axolotl/axolotl/examples/archived/tiny-llama/lora.yml"
    rc = main(["estimate", str(path.relative_to(Path.cwd())), "--gpu", "h100-sxm"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "axolotl config" in err and "TinyLlama/TinyLlama_v1.1" in err
    assert "Did you mean" in err and "TinyLlama-1.1B" in err


def test_unknown_torchtune_model_is_one_message(tmp_path):
    cfg = tmp_path / "tt.yaml"
    cfg.write_text("model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_2b\n"
                   "tokenizer: {_component_: x, max_seq_len: 512}\nbatch_size: 2\n")
    with pytest.raises(TrainplanError, match="Did you mean llama3_2_3b, llama3_2_1b"):
        configs.load(str(cfg))


@pytest.mark.parametrize("text, match", [
    ("base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: two\nsequence_len: 512\n",
     "micro_batch_size: must be a whole number"),
    ("base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 2\ndeepspeed: nowhere/ds.json\n",
     "names the DeepSpeed config nowhere/ds.json"),
    ("distributed_type: FSDP\nfsdp_config: {fsdp_sharding_strategy: HALF_SHARD}\n",
     "is not an FSDP sharding strategy"),
    ("zero_optimization: {stage: 4}\ntrain_micro_batch_size_per_gpu: 1\n",
     "is not a ZeRO stage"),
])
def test_bad_config_values(tmp_path, text, match, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    rc = main(["estimate", str(cfg), "--gpu", "h100-sxm", "--model", "hf:Qwen/Qwen2.5-0.5B"])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and "Traceback" not in err


def test_no_model_in_a_trainer_json_says_so(capsys):
    rc = main(["estimate", "tests/data/configs/trl/transformers/training_args.json", "--gpu",
               "h100-sxm"])
    err = capsys.readouterr().err
    assert rc == 2 and "TrainingArguments config" in err and "names no model" in err
