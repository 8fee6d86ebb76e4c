"""Gradient accumulation's one rule (Strategy.reduces_each_micro_batch): whether each micro-batch's
gradients are reduced over the devices as its backward runs, or only the last one's (no_sync on
the others). Memory (predict/sharding.py) and communication (predict/comm.py) read the same rule;
the job says the training loop's choice (`sync_each_batch`), the configs that set it read as it,
the exports write it, and the fix ladder offers it where FSDP holds full gradients."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

import trainplan.predict.sharding as sharding
from trainplan import configs
from trainplan.accelerators import get_accelerator
from trainplan.cli.main import main
from trainplan.export import launch_from_plan, render
from trainplan.plan import make_plan, select_platforms
from trainplan.predict.comm import DDP_BUCKET_BYTES, collective_s, exposed_comm
from trainplan.strategy import ALL, parse

from conftest import tiny_job, trace

N = 4
META = {"gradient_bytes": 2.0e9, "params_total": 1.0e9, "params_trainable": 1.0e9,
        "weight_bytes": 4.0e9, "largest_block_param_bytes": 0.1e9}
H100 = get_accelerator("h100-sxm")


def test_who_reduces_each_micro_batch():
    """DataParallel and DeepSpeed ZeRO-2/3 always do; ZeRO-1 never (full gradients to the
    boundary); DDP and FSDP as the training loop chooses (accelerate's default: no_sync)."""
    rule = {s.name: (s.reduces_each_micro_batch(False), s.reduces_each_micro_batch(True))
            for s in ALL}
    assert rule == {"single": (False, True), "dp": (True, True), "ddp": (False, True),
                    "fsdp": (False, True), "hsdp": (False, True), "zero1": (False, False),
                    "zero2": (True, True), "zero3": (True, True)}
    assert {s.name for s in ALL if s.loop_decides_sync} == {"single", "ddp", "fsdp", "hsdp"}


def _gradients(**kw) -> tuple[float, int]:
    """(one device's gradient bytes at the backward peak, the trainable parameter bytes)."""
    kw = {"strategy": "fsdp", **kw}
    job = tiny_job(gpus=N, precision="bf16-amp", num_layers=4, **kw)
    tr = trace(job, autocast=torch.bfloat16)
    c = {k: float(v) for k, v in tr.phase_peaks["backward"][1].items()}
    sharding.per_device(c, job, tr, "backward", N)
    return c["gradients"], tr.trainable_param_bytes


def test_fsdp_holds_full_gradients_only_under_no_sync():
    """With accumulation under no_sync every unsharded gradient (compute dtype: half the fp32
    stored bytes) stays from the first micro-batch to the last; syncing each keeps shards."""
    no_sync, trainable = _gradients(grad_accum=4)
    each, _ = _gradients(grad_accum=4, sync_each_batch=True)
    assert no_sync - each == pytest.approx(trainable / 2)
    # DeepSpeed ZeRO-3 never holds them, whatever the loop asks (sharding.py's ZeRO layout)
    assert _gradients(grad_accum=4, strategy="zero3")[0] == \
        pytest.approx(_gradients(grad_accum=4, strategy="zero3", sync_each_batch=True)[0])


def _comm(strategy: str, k: int, sync: bool, t_fwd=0.0, t_bwd=0.0, n=8) -> float:
    job = tiny_job(strategy=strategy, gpus=n, precision="bf16-amp", grad_accum=k,
                   sync_each_batch=sync)
    return exposed_comm(job, H100, META, n, t_fwd, t_bwd)[0]


def test_fsdp_reduce_scatters_once_a_step_under_no_sync():
    """Nothing to hide behind (t = 0): every micro-batch all-gathers twice plus the first unit
    again; the reduce-scatter and the last unit's run once a step under no_sync, k times when
    each micro-batch syncs."""
    k, n = 4, 8
    ag = collective_s("all_gather", META["params_total"] * 2, n, H100)
    rs = collective_s("reduce_scatter", META["params_trainable"] * 2, n, H100)
    unit = META["largest_block_param_bytes"] * 2 / 4          # its bf16 bytes
    first = collective_s("all_gather", unit, n, H100)
    last = collective_s("reduce_scatter", unit, n, H100)
    gather = first + 2 * ag
    assert _comm("fsdp", k, True) == pytest.approx(k * (gather + rs + last))
    assert _comm("fsdp", k, False) == pytest.approx(k * gather + rs + last)
    assert _comm("fsdp", 1, False) == pytest.approx(_comm("fsdp", 1, True))
    # DeepSpeed ZeRO-3 reduces every micro-batch, whatever the loop asks
    assert _comm("zero3", k, False) == pytest.approx(_comm("zero3", k, True))


def test_ddp_all_reduces_each_micro_batch_only_when_asked():
    k, n = 4, 8
    total = collective_s("all_reduce", META["gradient_bytes"], n, H100)
    assert DDP_BUCKET_BYTES < META["gradient_bytes"]
    assert _comm("ddp", k, False) == pytest.approx(total)
    assert _comm("ddp", k, True) == pytest.approx(k * total)
    # hidden behind a long backward, the last bucket of each sync is what shows
    last = collective_s("all_reduce", DDP_BUCKET_BYTES, n, H100)
    assert _comm("ddp", k, True, t_bwd=10.0) == pytest.approx(k * last)


def test_the_job_file_and_the_flag(tmp_path, capsys):
    base = ("model: transformer\ntransformer: {hidden_size: 64, num_layers: 2, num_heads: 4, "
            "intermediate_size: 128, vocab_size: 256}\nbatch_size: 2\nseq_len: 32\n"
            "grad_accum: 4\ngpus: 2\nstrategy: fsdp\ngpu: a100-sxm4-80gb\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "sync_each_batch: sometimes\n")
    assert main(["estimate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "sync_each_batch" in err and "true or false" in err and "Traceback" not in err
    good = tmp_path / "good.yaml"
    good.write_text(base + "sync_each_batch: true\n")
    assert main(["estimate", str(good), "--format", "json"]) == 0
    synced = json.loads(capsys.readouterr().out)
    good.write_text(base)
    assert main(["estimate", str(good), "--format", "json"]) == 0
    held = json.loads(capsys.readouterr().out)
    assert main(["estimate", str(good), "--sync-each-batch", "--format", "json"]) == 0
    flagged = json.loads(capsys.readouterr().out)
    assert flagged["per_device"] == synced["per_device"]
    assert held["per_device"]["peak_allocated_bytes"] > synced["per_device"]["peak_allocated_bytes"]


TRAINER = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": 2,
           "gradient_accumulation_steps": 4, "bf16": True, "fsdp": "full_shard auto_wrap",
           "output_dir": "out"}


@pytest.mark.parametrize("value", [
    {"gradient_accumulation_kwargs": {"sync_each_batch": True}},
    '{"gradient_accumulation_kwargs": {"sync_each_batch": true}}',
    "accelerator.json"])
def test_the_trainers_accelerator_config(value, tmp_path):
    (tmp_path / "accelerator.json").write_text(
        '{"split_batches": false, "gradient_accumulation_kwargs": {"sync_each_batch": true}}')
    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump({**TRAINER, "accelerator_config": value}))
    job, reading = configs.load(str(path))
    assert job.sync_each_batch is True
    assert any(f.key == "accelerator_config" and "every micro-batch" in f.meaning
               for f in reading.read)


def test_an_accelerator_config_without_it_keeps_no_sync(tmp_path):
    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump({**TRAINER, "accelerator_config": {"split_batches": True}}))
    job, reading = configs.load(str(path))
    assert job.sync_each_batch is False
    assert not any(f.key == "accelerator_config" for f in reading.read)
    path.write_text(yaml.safe_dump({**TRAINER, "accelerator_config": {
        "gradient_accumulation_kwargs": {"sync_each_batch": "yes"}}}))
    with pytest.raises(Exception, match="sync_each_batch must be true or false"):
        configs.load(str(path))


def test_torchtunes_distributed_recipe_reduces_each_micro_batch(tmp_path):
    path = tmp_path / "full_finetune_distributed.yaml"
    path.write_text("# tune run --nproc_per_node 4 full_finetune_distributed --config x\n"
                    + yaml.safe_dump({"model": {"_component_":
                                                "torchtune.models.qwen2_5.qwen2_5_0_5b"},
                                      "batch_size": 2, "gradient_accumulation_steps": 4,
                                      "dtype": "bf16", "tokenizer": {"max_seq_len": 512}}))
    job, _ = configs.load(str(path))
    assert job.strategy.name == "fsdp" and job.sync_each_batch is True


def _deep_fsdp_job(**kw):
    """Twenty 2048-wide blocks, 2,048 tokens, FSDP over Kaggle's two T4s at a global batch of 32:
    at micro-batch 2 it accumulates, and the full fp16 gradients are what does not fit."""
    return tiny_job(hidden_size=2048, num_layers=20, num_heads=16, intermediate_size=8192,
                    vocab_size=32000, seq_len=2048, batch_size=1, grad_accum=16,
                    strategy="fsdp", gpus=2, precision="fp16-amp", steps=100, **kw)


def test_the_fix_ladder_syncs_each_micro_batch_before_checkpointing(tmp_path):
    from dataclasses import replace
    job = _deep_fsdp_job()
    plan = make_plan(job, select_platforms(["kaggle-t4x2"]))
    pp = plan.platforms[0]
    rungs = [f.rung for f in pp.fixes]
    assert rungs[0] == "sync-each-batch", rungs
    fix = pp.fixes[0]
    assert fix.setting == {"sync_each_batch": True} and not fix.note and not fix.changes_training
    assert fix.saved_bytes_alone > 1.5 * 2**30 and "sync_each_batch=True" in fix.user_change
    assert pp.grad_accum > 1
    # what the plan keeps, the export asks the script for
    ln = launch_from_plan(plan, pp, job)
    assert ln.sync_each_batch and ln.syncs_each_micro_batch
    text = render(ln, "accelerate")["accelerate_config.yaml"]
    assert "GradientAccumulationPlugin(num_steps=" in text and "sync_each_batch=True" in text
    assert "every micro-batch (sync_each_batch)" in ln.header()
    assert ln.env()["TRAINPLAN_SYNC_EACH_BATCH"] == "1"
    assert "TRAINPLAN_SYNC_EACH_BATCH" not in replace(ln, sync_each_batch=False).env()
    # a job that already syncs each micro-batch is not offered it
    done = make_plan(_deep_fsdp_job(sync_each_batch=True), select_platforms(["kaggle-t4x2"]))
    assert "sync-each-batch" not in [f.rung for f in done.platforms[0].fixes]


def test_a_trainer_export_writes_accelerator_config(tmp_path):
    """Where the plan accumulates and syncs each micro-batch the Trainer's file says so, the
    source's other accelerator_config keys kept; it reads back as the same job."""
    from dataclasses import replace

    from trainplan.export.frameworks import Export, final_job
    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump({**TRAINER, "max_steps": 50, "accelerator_config": {
        "split_batches": True}}))
    job, reading = configs.load(str(path))
    job = job.with_(gpus=8, sync_each_batch=True)
    plats = select_platforms(["aws-p4d.24xlarge"])
    plan = make_plan(job, plats)
    pp = plan.platforms[0]
    ln = replace(launch_from_plan(plan, pp, job, job_file=str(path)), grad_accum=4)
    e = Export(ln, final_job(job, plats[0], pp).with_(grad_accum=4), reading, 50)
    files = render(ln, "trl", framework=e)
    out = yaml.safe_load(files["trl_config.yaml"])
    assert out["accelerator_config"] == {"split_batches": True, "gradient_accumulation_kwargs":
                                         {"sync_each_batch": True}}
    (tmp_path / "back").mkdir()
    (tmp_path / "back" / "trl.yaml").write_text(files["trl_config.yaml"])
    back, _ = configs.load(str(tmp_path / "back" / "trl.yaml"))
    assert back.sync_each_batch and back.grad_accum == 4
    # no accumulation: nothing to sync, the file as the user wrote it
    e1 = Export(replace(ln, grad_accum=1), e.job.with_(grad_accum=1), reading, 50)
    out1 = yaml.safe_load(render(e1.ln, "trl", framework=e1)["trl_config.yaml"])
    assert out1["accelerator_config"] == {"split_batches": True}


def test_the_step_says_which_it_assumed():
    job = tiny_job(strategy="fsdp", gpus=8, precision="bf16-amp", grad_accum=4)
    notes = exposed_comm(job, H100, META, 8, 0.1, 0.1)[2]
    assert any("last of 4 micro-batches" in n and "sync_each_batch" in n for n in notes)
    synced = exposed_comm(job.with_(sync_each_batch=True), H100, META, 8, 0.1, 0.1)[2]
    assert not any("micro-batches" in n for n in synced)
    assert parse("fsdp").reduces_each_micro_batch(True)


def test_a_step_too_big_under_no_sync_is_told_to_sync_each_micro_batch():
    """What no longer fits because FSDP holds every full gradient says its first fix."""
    from trainplan.estimate import estimate
    t4 = get_accelerator("t4")
    job = _deep_fsdp_job().with_(batch_size=2, grad_accum=8)
    held = [f for f in estimate(job, t4).findings if f.kind == "memory"]
    assert held and held[0].fix.startswith("sync_each_batch: true")
    synced = [f for f in estimate(job.with_(sync_each_batch=True), t4).findings
              if f.kind == "memory"]
    assert synced and "sync_each_batch" not in synced[0].fix
