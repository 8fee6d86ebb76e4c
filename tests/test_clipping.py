"""Gradient clipping (`max_grad_norm`): traced as torch's clip_grad_norm_ runs it, read from the
configs that set it (and from the HF Trainer's default), refused when out of range, written by
the exports as planned, and run by `trainplan measure`."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml

from conftest import tiny_job
from trainplan import configs
from trainplan.accelerators import get_accelerator
from trainplan.cli.main import main
from trainplan.predict.timing import estimate_step_time
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step


def _optimizer_ops(tr) -> Counter:
    return Counter(r.name for r in tr.ops if r.phase == "optimizer")


def _optimizer_bytes(tr) -> float:
    return sum(r.bytes for r in tr.ops if r.phase == "optimizer")


@pytest.mark.parametrize("foreach", [True, False])
def test_clipping_reads_every_gradient_twice_and_writes_it_once(foreach):
    """torch's clip_grad_norm_: the norm of every gradient (one multi-tensor kernel, or one a
    gradient), then every gradient scaled in place: 3 x the gradients' bytes, no more memory
    than a scalar a gradient."""
    sem = KernelSemantics(optimizer_foreach=foreach)
    plain = trace_step(tiny_job(), sem)
    clipped = trace_step(tiny_job(max_grad_norm=1.0), sem)
    extra = _optimizer_ops(clipped) - _optimizer_ops(plain)
    if foreach:
        assert extra["_foreach_norm"] == 1 and extra["_foreach_mul_"] == 1
    else:
        grads = sum(1 for r in plain.ops if r.phase == "optimizer" and r.name == "addcdiv_")
        assert extra["linalg_vector_norm"] == grads + 1 and extra["mul_"] == grads
    assert _optimizer_bytes(clipped) - _optimizer_bytes(plain) == pytest.approx(
        3 * plain.gradient_bytes, rel=0.01)
    assert clipped.peak_allocated_bytes - plain.peak_allocated_bytes < 4096


def test_clipping_costs_its_pass_over_the_gradients():
    """On a GPU the two passes are bandwidth-bound: the step grows by about 3 x the gradients'
    bytes at the device's bandwidth, and only the optimizer's part of it."""
    job = tiny_job(hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048,
                   vocab_size=8192, batch_size=4, seq_len=256)
    clip = job.with_(max_grad_norm=1.0)
    h100 = get_accelerator("h100-sxm")
    sem = KernelSemantics()
    plain_t = estimate_step_time(trace_step(job, sem), h100, job)
    clip_tr = trace_step(clip, sem)
    clip_t = estimate_step_time(clip_tr, h100, clip)
    grow = clip_t.breakdown_s["optimizer"] - plain_t.breakdown_s["optimizer"]
    floor = 3 * clip_tr.gradient_bytes / h100.memory_bandwidth_bytes_per_s
    assert floor < grow < 20 * floor          # bandwidth-bound, plus a kernel's floor each
    assert clip_t.breakdown_s["compute"] == pytest.approx(plain_t.breakdown_s["compute"])
    assert clip_t.step_time_s > plain_t.step_time_s


@pytest.mark.parametrize("flag, message", [
    ("-1", "must be a number >= 0"), ("nan", "must be a number >= 0"),
    ("inf", "must be a number >= 0")])
def test_a_bad_clipping_norm_is_refused(flag, message, capsys):
    argv = ["estimate", "--model", "hf:gpt2", "--seq-len", "128", "--gpu", "h100-sxm",
            f"--max-grad-norm={flag}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "--max-grad-norm 1.0" in err and "Traceback" not in err


def test_a_clipping_norm_that_is_not_a_number_is_refused_in_a_job_file(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text("model: hf:gpt2\nseq_len: 128\nmax_grad_norm: one\n")
    assert main(["estimate", str(job), "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "max_grad_norm must be a number" in err and "line 3" in err


def test_zero_is_no_clipping():
    assert tiny_job(max_grad_norm=0).max_grad_norm is None
    assert tiny_job(max_grad_norm=0.5).max_grad_norm == 0.5


TRAINER = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": 2,
           "bf16": True, "output_dir": "out", "max_steps": 10}


def _load(tmp_path, data: dict, name: str = "trl.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return configs.load(str(path))


def test_the_trainer_clips_to_one_by_default_and_zero_turns_it_off(tmp_path):
    job, reading = _load(tmp_path, TRAINER)
    assert job.max_grad_norm == 1.0
    assert any("max_grad_norm not set: 1.0" in a for a in reading.assumed)
    job, reading = _load(tmp_path, {**TRAINER, "max_grad_norm": 0})
    assert job.max_grad_norm is None
    assert any(f.key == "max_grad_norm" and f.meaning == "no gradient clipping"
               for f in reading.read)
    job, _ = _load(tmp_path, {**TRAINER, "max_grad_norm": 0.3})
    assert job.max_grad_norm == 0.3


def test_axolotl_passes_only_a_nonzero_norm_on(tmp_path):
    """axolotl's trainer builder: `if cfg.max_grad_norm:` -- a 0 leaves the Trainer's 1.0."""
    base = {"base_model": "Qwen/Qwen2.5-0.5B", "micro_batch_size": 2, "sequence_len": 512,
            "bf16": True, "max_steps": 10}
    job, reading = _load(tmp_path, {**base, "max_grad_norm": 0}, "axolotl.yaml")
    assert reading.kind == "axolotl" and job.max_grad_norm == 1.0
    job, _ = _load(tmp_path, {**base, "max_grad_norm": 2.0}, "axolotl.yaml")
    assert job.max_grad_norm == 2.0


def test_deepspeed_gradient_clipping(tmp_path):
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "zero_optimization": {"stage": 2}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    job, _ = _load(tmp_path, {**TRAINER, "deepspeed": "ds.json", "max_grad_norm": 0.5})
    assert job.max_grad_norm == 0.5 and job.strategy.name == "zero2"
    (tmp_path / "ds.json").write_text(json.dumps({**ds, "gradient_clipping": 2.0}))
    with pytest.raises(Exception, match="gradient_clipping: 2.0 while the TRL config clips to "
                                        "1.0"):
        _load(tmp_path, {**TRAINER, "deepspeed": "ds.json"})
    # beside a trainplan job DeepSpeed's own value wins, 0 being none
    (tmp_path / "ds.json").write_text(json.dumps({**ds, "gradient_clipping": 0}))
    (tmp_path / "job.yaml").write_text("model: hf:gpt2\nseq_len: 128\nmax_grad_norm: 1.0\n")
    job, _ = configs.load(str(tmp_path / "job.yaml"), deepspeed=str(tmp_path / "ds.json"))
    assert job.max_grad_norm is None


def test_torchtune_clip_grad_norm(tmp_path):
    base = {"model": {"_component_": "torchtune.models.qwen2_5.qwen2_5_0_5b"}, "batch_size": 2,
            "dtype": "bf16", "tokenizer": {"max_seq_len": 512}}
    job, _ = _load(tmp_path, base, "full_finetune_single_device.yaml")
    assert job.max_grad_norm is None
    job, _ = _load(tmp_path, {**base, "clip_grad_norm": 1.0}, "full_finetune_single_device.yaml")
    assert job.max_grad_norm == 1.0


@pytest.mark.parametrize("clip", [None, 1.0])
def test_exports_write_the_planned_clipping(clip, tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text("model: hf:Qwen/Qwen2.5-0.5B\nbatch_size: 2\nseq_len: 256\nprecision: bf16\n"
                   "steps: 20\nstrategy: zero2\ngpus: 8\n"
                   + (f"max_grad_norm: {clip}\n" if clip else ""))
    for to in ("deepspeed", "trl", "axolotl"):
        out = tmp_path / to
        assert main(["export", str(job), "--platform", "aws-p5.48xlarge", "--to", to,
                     "--out", str(out)]) == 0, capsys.readouterr().err
    ds = json.loads((tmp_path / "deepspeed" / "ds_config.json").read_text())
    assert ds["gradient_clipping"] == (clip or 0.0)
    trl = (tmp_path / "trl" / "trl_config.yaml").read_text()
    said = " ".join(trl.replace("#", " ").split())        # the header, its lines unwrapped
    assert yaml.safe_load(trl)["max_grad_norm"] == (clip or 0.0)
    assert json.loads((tmp_path / "trl" / "ds_config.json").read_text())[
        "gradient_clipping"] == "auto"                  # the Trainer's max_grad_norm fills it
    assert ("gradients clipped to global norm 1" if clip else "no gradient clipping") in said
    back, _ = configs.load(str(tmp_path / "trl" / "trl_config.yaml"))
    assert back.max_grad_norm == clip
    axo = (tmp_path / "axolotl" / "axolotl.yaml").read_text()
    assert ("max_grad_norm" in yaml.safe_load(axo)) == bool(clip)
    said = " ".join(axo.replace("#", " ").split())
    assert ("passes only a non-zero max_grad_norm" in said) == (not clip)


def test_measure_clips_as_the_job_says(tmp_path):
    from unittest import mock

    import torch

    from trainplan.measure.runner import run_measurement
    real = torch.nn.utils.clip_grad_norm_
    with mock.patch("torch.nn.utils.clip_grad_norm_", side_effect=real) as clip:
        rec, _ = run_measurement(tiny_job(max_grad_norm=0.5), steps=2, warmup=1,
                                 out=tmp_path / "r.jsonl")
    assert clip.call_count == 3 and clip.call_args.args[1] == 0.5     # warm-up + 2 steps
    assert rec["job"]["max_grad_norm"] == 0.5
