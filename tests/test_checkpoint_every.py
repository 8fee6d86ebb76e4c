"""Checkpointing every K-th block (`--grad-checkpointing every-K`: torchtitan's and torchtune's
selective layer mode, fms-fsdp's `selective_checkpointing: 1/K`): which blocks are wrapped, a
step between no checkpointing and full in closed form, the spellings, a torchtune config that
asks for it, and the exports that write it or say they cannot."""
from __future__ import annotations

import pytest

from trainplan import configs
from trainplan.accelerators import get_accelerator
from trainplan.cli.main import main
from trainplan.errors import TrainplanError
from trainplan.predict import evaluate
from trainplan.spec import checkpointing_label, every_k, validate

from conftest import tiny_job


@pytest.mark.parametrize("given,canonical", [("every-2", "every-2"), ("EVERY-3", "every-3"),
                                             ("every-1", "full"), ("full", "full"),
                                             ("selective", "selective"), ("none", "none")])
def test_spellings(given, canonical):
    assert tiny_job(grad_checkpointing=given).grad_checkpointing == canonical


@pytest.mark.parametrize("bad", ["every-0", "every-x", "every", "half"])
def test_bad_modes_are_refused_with_the_choices(bad):
    with pytest.raises(TrainplanError) as e:
        tiny_job(grad_checkpointing=bad)
    assert "every-K" in str(e.value) and "selective" in str(e.value)


def test_k_and_words():
    assert [every_k(m) for m in ("none", "selective", "full", "every-2", "every-12")] == \
        [0, 0, 1, 2, 12]
    assert checkpointing_label("every-2") == "activation checkpointing of every 2nd block"
    assert checkpointing_label("full") == "full activation checkpointing"
    assert checkpointing_label("none") == "no activation checkpointing"


def _step(mode: str, layers: int = 4):
    job = tiny_job(num_layers=layers, grad_checkpointing=mode, precision="bf16-amp",
                   batch_size=8, seq_len=256)
    return evaluate(job, get_accelerator("a100-80gb"))


def test_every_kth_block_is_wrapped_as_torchtitan_counts():
    """torchtitan wraps a block when its running count (from 1) is divisible by K."""
    assert _step("every-2").trace.checkpointed_blocks == ["layers.1", "layers.3"]
    assert _step("every-4", 8).trace.checkpointed_blocks == ["layers.3", "layers.7"]
    assert len(_step("full").trace.checkpointed_blocks) == 4


def test_half_the_blocks_cost_half_of_each_way():
    """Alike blocks, half of them checkpointed: the kept activations, the recompute and so the
    step time, and the peak, each halfway between no checkpointing and full."""
    none, half, full = (_step(m) for m in ("none", "every-2", "full"))
    assert half.trace.activation_bytes == (none.trace.activation_bytes
                                           + full.trace.activation_bytes) / 2
    assert half.time.step_time_s == pytest.approx((none.time.step_time_s
                                                   + full.time.step_time_s) / 2, rel=1e-9)
    assert none.memory.peak_allocated_bytes > half.memory.peak_allocated_bytes > \
        full.memory.peak_allocated_bytes


def test_cli_takes_it_and_refuses_a_bad_one(capsys):
    args = ["estimate", "--model", "hf:gpt2", "--batch-size", "2", "--seq-len", "128",
            "--gpu", "t4", "-q"]
    assert main(args + ["--grad-checkpointing", "every-2"]) == 0
    assert main(args + ["--grad-checkpointing", "every-zero"]) == 2
    err = capsys.readouterr().err
    assert "every-K" in err and "Traceback" not in err


TORCHTUNE = """# tune run --nproc_per_node 8 full_finetune_distributed --config this
model: {_component_: torchtune.models.llama3_2.llama3_2_1b}
tokenizer: {_component_: torchtune.models.llama3.llama3_tokenizer, path: /t, max_seq_len: 1024}
batch_size: 2
dtype: bf16
optimizer: {_component_: torch.optim.AdamW, lr: 2.0e-5}
enable_activation_checkpointing: true
"""


@pytest.mark.parametrize("extra,mode", [("", "full"), ("ac_mode: selective\nac_option: 2\n",
                                                      "every-2"),
                                        ("ac_mode: selective\nac_option: op\n", "selective"),
                                        ("ac_mode: selective\nac_option: 1\n", "full"),
                                        ("ac_mode: full\n", "full")])
def test_torchtune_selective_layer_mode(tmp_path, extra, mode):
    cfg = tmp_path / "tt.yaml"
    cfg.write_text(TORCHTUNE + extra)
    job, reading = configs.load(str(cfg))
    assert validate(job).grad_checkpointing == mode


def test_torchtune_export_writes_it_back(tmp_path):
    """Planned on one H100 and exported, the torchtune config reads back as every-2."""
    from trainplan.export import launch_from_plan, render, write
    from trainplan.export.frameworks import Export, final_job
    from trainplan.plan import make_plan
    from trainplan.platforms import platforms_with
    cfg = tmp_path / "tt.yaml"
    cfg.write_text(TORCHTUNE + "ac_mode: selective\nac_option: 2\n")
    job, reading = configs.load(str(cfg))
    job = validate(job.with_(steps=50, gpus=1))
    plat = platforms_with("h100-sxm", 1)[0]
    plan = make_plan(job, [plat])
    pp = plan.platforms[0]
    ln = launch_from_plan(plan, pp, job, job_file=str(cfg))
    e = Export(ln, final_job(job, plat, pp), reading, 50)
    out = tmp_path / "out"
    files = render(ln, "torchtune", framework=e)
    write(files, out)
    back, _ = configs.load(str(out / "torchtune.yaml"))
    assert back.grad_checkpointing == "every-2"
    trl = render(ln, "trl", framework=e)["trl_config.yaml"]
    assert "activation checkpointing of every 2nd block planned" in trl
