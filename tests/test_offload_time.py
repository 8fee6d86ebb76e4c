"""ZeRO-Offload's step time (predict/offload.py): the update on the host CPU and the host-link
copies, in place of the GPU's optimizer kernels."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.predict import offload
from trainplan.predict.timing import estimate_step_time, summarize
from trainplan.spec import Job, validate
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

from conftest import tiny_job
from plan_examples import run_cli

DATA = offload._data()
PER_CORE = DATA["cpu_adam_params_per_s_per_core"]


@pytest.fixture(scope="module")
def step():
    """A small decoder's traced step (fp32 AdamW) and its job."""
    job = tiny_job(num_layers=2, batch_size=4, seq_len=64)
    return job, trace_step(job, KernelSemantics(attention="efficient"))


def _time(step, cores=None, accel="a100-sxm4-40gb", **kw):
    job, tr = step
    job = validate(replace(job, **kw))
    return estimate_step_time(tr, get_accelerator(accel), job, cpu_cores=cores)


def test_offloaded_update_replaces_the_devices_optimizer_kernels(step):
    plain = _time(step)
    off = _time(step, cores=8, offload="optimizer")
    meta = summarize(step[1]).meta
    update = meta["params_trainable"] / min(8 * PER_CORE, DATA["cpu_adam_params_per_s_max"])
    # the GPU's AdamW kernels are gone; the host's update stands in their place
    assert off.breakdown_s["optimizer"] == pytest.approx(update)
    assert plain.breakdown_s["optimizer"] > 0
    link, _ = offload.host_link_bytes_per_s(get_accelerator("a100-sxm4-40gb"))
    # the updated parameters come back over the link after the update, serially
    assert off.breakdown_s["communication"] >= meta["params_trainable"] * 4 / link   # fp32
    assert off.step_time_s == pytest.approx(
        plain.step_time_s - plain.breakdown_s["optimizer"] + update
        + off.breakdown_s["communication"] - plain.breakdown_s["communication"], rel=1e-9)
    assert any("CPU offload" in n and "CPUAdam" in n for n in off.notes)


def test_a_step_the_host_update_dominates_is_offload_bound(step, monkeypatch):
    """On a host a thousand times slower the tiny model's update outweighs its kernels."""
    slow = dict(DATA, cpu_adam_params_per_s_per_core=PER_CORE / 1000)
    monkeypatch.setattr(offload, "_data", lambda: slow)
    assert _time(step, cores=1, offload="optimizer").bound == "offload"
    assert _time(step, cores=1).bound != "offload"


def test_fewer_host_cores_make_the_update_slower_until_memory_bounds_it(step):
    one, four = (_time(step, cores=c, offload="optimizer").breakdown_s["optimizer"]
                 for c in (1, 4))
    assert one == pytest.approx(2 * _time(step, cores=2, offload="optimizer")
                                .breakdown_s["optimizer"])
    assert one > four
    # past r_max / r_core cores the host's memory bandwidth bounds it, not its cores
    many = DATA["cpu_adam_params_per_s_max"] / PER_CORE
    assert _time(step, cores=int(4 * many), offload="optimizer").breakdown_s["optimizer"] == \
        pytest.approx(_time(step, cores=int(8 * many), offload="optimizer")
                      .breakdown_s["optimizer"])


def test_without_a_core_count_the_reference_host_is_assumed(step):
    ref = DATA["reference_cores_per_device"]
    assert _time(step, offload="optimizer").breakdown_s["optimizer"] == \
        pytest.approx(_time(step, cores=ref, offload="optimizer").breakdown_s["optimizer"])


def test_ranks_share_the_hosts_cores_and_each_updates_its_partition(step):
    one = _time(step, cores=2, offload="optimizer", strategy="zero2")
    two = _time(step, cores=2, offload="optimizer", strategy="zero2", gpus=2)
    # half the parameters per rank on half the cores each (below the memory bound): the same
    assert 2 * PER_CORE < DATA["cpu_adam_params_per_s_max"]
    assert two.breakdown_s["optimizer"] == pytest.approx(one.breakdown_s["optimizer"])


def test_offloaded_parameters_are_fetched_per_micro_batch(step):
    opt = _time(step, cores=8, offload="optimizer", strategy="zero3", gpus=2)
    both = _time(step, cores=8, offload="optimizer+params", strategy="zero3", gpus=2)
    assert both.breakdown_s["optimizer"] == pytest.approx(opt.breakdown_s["optimizer"])
    assert any("fetched from the host 2 times" in n for n in both.notes)


def test_fsdp_offload_runs_torchs_update_on_the_host_and_fetches_the_parameters(step):
    """FSDP's CPU offload keeps parameters, gradients and the update on the host whatever is
    asked: torch.optim's single-tensor loop, slower than CPUAdam by the measured ratio."""
    zero = _time(step, cores=2, offload="optimizer+params", strategy="zero3", gpus=2)
    fsdp = _time(step, cores=2, offload="optimizer", strategy="fsdp", gpus=2)
    ratio = DATA["cpu_adam_params_per_s_per_core"] / DATA["torch_adam_params_per_s_per_core"]
    assert fsdp.breakdown_s["optimizer"] == pytest.approx(zero.breakdown_s["optimizer"] * ratio)
    note = next(n for n in fsdp.notes if n.startswith(offload.NOTE))
    assert "torch.optim on FSDP's CPU offload" in note and "fetched from the host 2 times" in note
    # the memory bound scales with the loop's extra passes too
    many = 10_000
    assert offload.cpu_adam_params_per_s(many, fused=False) == pytest.approx(
        offload.cpu_adam_params_per_s(many) / ratio)


@pytest.mark.parametrize("link, per_direction", [
    ("pcie3 x16", 16 * 8e9 * 128 / 130 / 8), ("pcie4 x16", 16 * 16e9 * 128 / 130 / 8),
    ("pcie5 x16", 16 * 32e9 * 128 / 130 / 8), ("pcie4 x8", 8 * 16e9 * 128 / 130 / 8)])
def test_pcie_links_at_their_lanes_and_generation(link, per_direction):
    accel = replace(get_accelerator("a100-sxm4-40gb"), host_link=link)
    rate, how = offload.host_link_bytes_per_s(accel)
    assert rate == pytest.approx(per_direction * DATA["pcie_efficiency"], rel=1e-6)
    assert how == link


def test_other_links():
    gb200 = get_accelerator("gb200")
    assert offload.host_link_bytes_per_s(gb200)[0] == 450e9
    odd = replace(gb200, host_link="pcie")
    rate, how = offload.host_link_bytes_per_s(odd)
    assert "taken as pcie4 x16" in how and rate == pytest.approx(
        offload.host_link_bytes_per_s(replace(gb200, host_link="pcie4 x16"))[0])


def test_every_catalog_gpu_that_can_offload_has_a_link():
    from trainplan.accelerators import load_accelerators
    for a in load_accelerators().values():
        if a.kind == "gpu" and a.backend != "mps":
            assert "taken as" not in offload.host_link_bytes_per_s(a)[1], a.id


def test_the_estimate_says_what_the_offloaded_step_rests_on(capsys):
    """The note reaches the user, in text and in JSON."""
    argv = ["estimate", "--model", "hf:openai-community/gpt2", "--gpu", "a100-sxm4-40gb",
            "--offload", "optimizer", "--seq-len", "128"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "CPUAdam" in out
    code, out, err = run_cli(capsys, *argv, "--format", "json")
    notes = json.loads(out)["notes"]
    assert any("CPU offload" in n for n in notes)
    assert len(notes) == len(set(notes))


def test_a_plan_with_offload_times_the_host_update_on_the_platforms_cores(capsys, tmp_path):
    """Kaggle's 2 x T4 notebook has 4 CPU cores (data/platforms.csv): 2 for each rank's update,
    said in the launch checklist."""
    job = tmp_path / "tiny.yaml"
    job.write_text("model: {hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: "
                   "128, vocab_size: 256, kind: decoder}\nbatch_size: 2\nseq_len: 32\n")
    code, out, err = run_cli(capsys, "plan", str(job), "--platforms", "kaggle-t4x2",
                             "--strategy", "zero2", "--offload", "optimizer", "--steps", "100",
                             "--format", "md")
    assert code == 0, err
    assert "CPU offload: the optimizer update runs on the host" in out
    assert "on 2 of the platform's cores" in out


@pytest.mark.parametrize("strategy, gpus, level, runs", [
    ("single", 1, "optimizer", "zero2"), ("ddp", 2, "optimizer", "zero2"),
    ("dp", 2, "optimizer", "zero2"), ("zero2", 1, "optimizer+params", "zero3"),
    ("zero1", 2, "optimizer", None), ("zero2", 1, "optimizer", None),
    ("fsdp", 2, "optimizer", None), ("zero3", 2, "optimizer+params", None)])
def test_offload_is_planned_under_the_launcher_that_runs_it(strategy, gpus, level, runs):
    """DeepSpeed's offload_optimizer is ZeRO's (stages 1-3), offload_param stage 3's; FSDP has
    its own. Under DDP, DataParallel or one plain device the plan runs it as the fix ladder's
    offload rungs do (plan/fixes.py `_offload`)."""
    from trainplan.predict import compat
    job = validate(Job(model="hf:openai-community/gpt2", gpus=gpus, strategy=strategy,
                       offload=level))
    adapted, changes = compat.adapt(job, get_accelerator("t4"))
    said = [c for c in changes if "runs under DeepSpeed" in c]
    if runs is None:
        assert not said and adapted.strategy.name == strategy
    else:
        assert adapted.strategy.name == runs and said


def test_fsdp_offload_is_of_the_parameters_too():
    """FSDP has no offload of the optimizer state alone (accelerate's fsdp_offload_params moves
    the parameters, gradients and update): --offload optimizer under FSDP is planned as what
    runs, and the fix ladder's offload rung for an FSDP job offers that, under FSDP."""
    from trainplan.plan.fixes import RUNGS
    from trainplan.predict import compat
    job = validate(Job(model="hf:openai-community/gpt2", gpus=2, strategy="fsdp",
                       offload="optimizer"))
    adapted, changes = compat.adapt(job, get_accelerator("t4"))
    assert adapted.offload == "optimizer+params" and adapted.strategy.name == "fsdp"
    assert any("FSDP has no offload of the optimizer state alone" in c for c in changes)
    plain = validate(Job(model="hf:openai-community/gpt2", gpus=2, strategy="fsdp"))
    step = RUNGS["offload-optimizer"](plain, get_accelerator("t4"), 2)
    assert step.job.offload == "optimizer+params" and step.job.strategy.name == "fsdp"
    assert "FSDP's CPUOffload" in step.title
    assert RUNGS["offload-params"](step.job, get_accelerator("t4"), 2) is None
