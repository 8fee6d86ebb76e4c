"""Hybrid sharding (strategy hsdp: FSDP's HYBRID_SHARD, fms-fsdp's and torchtitan's HSDP): FSDP
within each node, a replica a node, the gradient shards all-reduced between replicas. What a
device holds is FSDP's over one node's GPUs; what it sends is FSDP's collectives over NVLink plus
the replicas' all-reduce through the node's NIC; configs that ask for it read as it; exports
write it."""
from __future__ import annotations

import pytest
import torch
import yaml

import trainplan.predict.sharding as sharding
from trainplan import configs
from trainplan.accelerators import get_accelerator
from trainplan.predict.comm import NODE_NIC_BYTES_PER_S, collective_s, exposed_comm, \
    replica_all_reduce_s
from trainplan.strategy import DEVICES_PER_NODE, FSDP, HSDP, parse

from conftest import tiny_job, trace


@pytest.mark.parametrize("spelling", ["hsdp", "HSDP", "hybrid_shard", "HYBRID_SHARD",
                                      "hybrid-shard", "fsdp-hybrid"])
def test_spellings(spelling):
    assert parse(spelling) is HSDP


def test_shards_over_one_node():
    assert DEVICES_PER_NODE == 8
    assert [HSDP.shard_devices(n) for n in (1, 2, 8, 16, 96)] == [1, 2, 8, 8, 8]
    assert [FSDP.shard_devices(n) for n in (1, 2, 8, 16, 96)] == [1, 2, 8, 16, 96]
    assert HSDP.fsdp and HSDP.hybrid and HSDP.shards_weights and not FSDP.hybrid


def _per_device(strategy: str, n: int, phase: str) -> dict[str, float]:
    job = tiny_job(strategy=strategy, gpus=n, precision="bf16-amp", num_layers=4)
    tr = trace(job, autocast=torch.bfloat16)
    c = {k: float(v) for k, v in tr.phase_peaks[phase][1].items()}
    sharding.per_device(c, job, tr, phase, n)
    return c


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
def test_a_device_holds_what_fsdp_over_its_node_holds(phase):
    """16 GPUs in two nodes of 8: each holds 1/8 of the state, as FSDP on 8 does, not 1/16."""
    hybrid, node = _per_device("hsdp", 16, phase), _per_device("fsdp", 8, phase)
    full = _per_device("fsdp", 16, phase)
    assert hybrid == pytest.approx(node)
    assert hybrid["optimizer_states"] == pytest.approx(2 * full["optimizer_states"])
    # on one node hybrid sharding is full sharding
    assert _per_device("hsdp", 4, phase) == pytest.approx(_per_device("fsdp", 4, phase))


META = {"gradient_bytes": 2.0e9, "params_total": 1.0e9, "params_trainable": 1.0e9,
        "weight_bytes": 4.0e9, "largest_block_param_bytes": 0.1e9}


def _comm(strategy: str, n: int, t_fwd: float, t_bwd: float, accel="h100-sxm"):
    job = tiny_job(strategy=strategy, gpus=n, precision="bf16-amp")
    return exposed_comm(job, get_accelerator(accel), META, n, t_fwd, t_bwd)


def test_replicas_all_reduce_their_shards_through_the_nic():
    """r replicas: each node's NIC carries 2(r-1)/r of the whole gradient, its 8 ranks' shards."""
    a = get_accelerator("h100-sxm")
    g = 2.0e9
    assert replica_all_reduce_s(g, 8, 8, a) == 0.0
    assert replica_all_reduce_s(g, 16, 8, a) == pytest.approx(g / NODE_NIC_BYTES_PER_S)
    assert replica_all_reduce_s(g, 96, 8, a) == pytest.approx(2 * 11 / 12 * g
                                                              / NODE_NIC_BYTES_PER_S)


def test_nothing_hidden_is_every_collective():
    """With no compute to hide behind, the exposed time is the closed form: the first unit's
    gather, the last unit's reduce-scatter and all-reduce, the forward's gathers, the backward's
    gathers, reduce-scatters and the replicas' all-reduce; within a node, at NVLink's rate."""
    a = get_accelerator("h100-sxm")
    p, unit = 1.0e9 * 2, 0.1e9 * 2 / 4        # bf16 parameters; the block's bf16 share
    ag = collective_s("all_gather", p, 8, a)
    rs = collective_s("reduce_scatter", p, 8, a)
    ar = replica_all_reduce_s(p, 16, 8, a)
    first = collective_s("all_gather", unit, 8, a)
    last = collective_s("reduce_scatter", unit, 8, a) + replica_all_reduce_s(unit, 16, 8, a)
    exposed, _, notes = _comm("hsdp", 16, 0.0, 0.0)
    assert exposed == pytest.approx(first + last + ag + ag + rs + ar)
    assert any("hybrid sharding" in n for n in notes)


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "fsdp", "hsdp"])
def test_a_hidden_collective_slows_the_compute_beside_it(strategy):
    """With a slowdown s, the step pays s x each second of collectives hidden under compute
    (those exposed with nothing to hide behind, less those exposed), and nothing for what is
    already exposed (comm.py `exposed_comm`)."""
    job = tiny_job(strategy=strategy, gpus=16, precision="bf16-amp")
    a = get_accelerator("h100-sxm")
    none = exposed_comm(job, a, META, 16, 0.0, 0.0)[0]
    free, _, notes = exposed_comm(job, a, META, 16, 0.01, 0.03)
    paid, _, said = exposed_comm(job, a, META, 16, 0.01, 0.03, slowdown=0.189)
    assert free < none        # something is hidden in the windows
    assert paid == pytest.approx(free + 0.189 * (none - free))
    assert not any("slow it" in n for n in notes) and any("slow it by 19%" in n for n in said)
    # nothing to hide behind: nothing hidden, nothing added
    assert exposed_comm(job, a, META, 16, 0.0, 0.0, slowdown=0.189)[0] == none


def test_hybrid_sends_less_between_nodes_than_full_sharding():
    for n in (16, 64):
        assert _comm("hsdp", n, 0.0, 0.0)[0] < _comm("fsdp", n, 0.0, 0.0)[0]
    # one node: the same collectives
    assert _comm("hsdp", 8, 0.01, 0.02) == _comm("fsdp", 8, 0.01, 0.02)


def test_accelerate_and_trainer_configs_read_as_hsdp(tmp_path):
    acc = tmp_path / "acc.yaml"
    acc.write_text("distributed_type: FSDP\nnum_processes: 16\nnum_machines: 2\n"
                   "mixed_precision: bf16\nfsdp_config: {fsdp_sharding_strategy: HYBRID_SHARD}\n")
    job, reading = configs.load(str(acc))
    doc = reading.to_json()
    assert job.strategy is HSDP and doc["not_modelled"] == []
    assert [(r["value"], r["meaning"]) for r in doc["read"]
            if r["key"].endswith("fsdp_sharding_strategy")] == [("HYBRID_SHARD", "strategy hsdp")]
    acc.write_text("distributed_type: FSDP\nnum_processes: 16\n"
                   "fsdp_config: {fsdp_sharding_strategy: HYBRID_SHARD_ZERO2}\n")
    job, reading = configs.load(str(acc))
    assert job.strategy == "zero2"
    assert [u["value"] for u in reading.to_json()["not_modelled"]
            if u["key"].endswith("fsdp_sharding_strategy")] == ["HYBRID_SHARD_ZERO2"]
    trl = tmp_path / "trl.yaml"
    trl.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 2\n"
                   "dataset_name: trl-lib/Capybara\n"
                   "fsdp: hybrid_shard auto_wrap\n")
    assert configs.load(str(trl))[0].strategy is HSDP


def test_axolotl_replicas_read_as_hsdp(tmp_path):
    base = ("base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 2\nsequence_len: 512\n"
            "datasets: [{path: x, type: alpaca}]\nfsdp_version: 2\n"
            "fsdp_config: {reshard_after_forward: true}\n")
    cfg = tmp_path / "a.yml"
    cfg.write_text(base + "dp_shard_size: 8\ndp_replicate_size: 2\n")
    assert configs.load(str(cfg))[0].strategy is HSDP
    cfg.write_text(base + "dp_shard_size: 4\ndp_replicate_size: 4\n")
    job, reading = configs.load(str(cfg))
    assert job.strategy is HSDP
    assert [(u["key"], u["value"]) for u in reading.to_json()["not_modelled"]
            if "dp_" in u["key"]] == [("dp_shard_size", 4)]
    cfg.write_text(base)
    assert configs.load(str(cfg))[0].strategy is FSDP


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A tiny decoder planned with hybrid sharding on 16 H100s: two nodes of 8."""
    from trainplan.export import launch_from_plan
    from trainplan.jobfile import load_job
    from trainplan.plan import make_plan
    from trainplan.platforms import platforms_with
    path = tmp_path_factory.mktemp("hsdp") / "job.yaml"
    path.write_text("name: tiny\nmodel: transformer\ntransformer: {hidden_size: 64, num_layers: "
                    "2, num_heads: 4, intermediate_size: 128, vocab_size: 256, kind: decoder}\n"
                    "batch_size: 4\nseq_len: 32\nsteps: 50\nprecision: bf16-amp\n"
                    "strategy: hsdp\n")
    job = load_job(str(path))
    plats = platforms_with("h100-sxm", 16)
    plan = make_plan(job, plats)
    pp = plan.platforms[0]
    assert pp.strategy == "hsdp" and pp.devices == 16
    return launch_from_plan(plan, pp, job, job_file=str(path))


def test_exports_write_hybrid_sharding(two_nodes, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    from trainplan.export import render
    f = tmp_path / "acc.yaml"
    f.write_text(render(two_nodes, "accelerate")["accelerate_config.yaml"])
    cfg = load_config_from_file(str(f))
    assert str(cfg.distributed_type).endswith("FSDP")
    assert cfg.fsdp_config["fsdp_sharding_strategy"] == "HYBRID_SHARD"
    assert cfg.num_processes == 16 and cfg.num_machines == 2
    doc = yaml.safe_load(f.read_text())
    assert doc["fsdp_config"]["fsdp_sharding_strategy"] == "HYBRID_SHARD"
    ds = render(two_nodes, "deepspeed")["ds_config.json"]
    assert '"stage": 3' in ds and "hybrid sharding" in ds


@pytest.mark.parametrize("kind,name", [("trl", "trl_config.yaml"), ("axolotl", "axolotl.yaml")])
def test_framework_exports_read_back_as_hsdp(kind, name, tmp_path):
    """A TRL / axolotl config asking for hybrid sharding on two nodes, planned and exported to
    either framework, reads back as hybrid sharding."""
    from trainplan.export import launch_from_plan, render, write
    from trainplan.export.frameworks import Export, final_job
    from trainplan.plan import make_plan
    from trainplan.platforms import platforms_with
    from trainplan.spec import validate
    cfg = tmp_path / "in.yaml"
    cfg.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 2\n"
                   "dataset_name: trl-lib/Capybara\nmax_length: 512\nbf16: true\n"
                   "fsdp: hybrid_shard auto_wrap\n")
    job, reading = configs.load(str(cfg))
    job = validate(job.with_(steps=50, gpus=16))
    plat = platforms_with("h100-sxm", 16)[0]
    plan = make_plan(job, [plat])
    pp = plan.platforms[0]
    assert pp.strategy == "hsdp"
    ln = launch_from_plan(plan, pp, job, job_file=str(cfg))
    out = tmp_path / "out"
    write(render(ln, kind, framework=Export(ln, final_job(job, plat, pp), reading, 50)), out)
    back, _ = configs.load(str(out / name))
    assert back.strategy is HSDP
