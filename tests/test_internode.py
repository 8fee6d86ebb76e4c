"""The network between nodes (Job.internode_gbps): a cluster's NICs as sold, Gbit/s per 8-GPU
node each way. Collectives that cross nodes run at it (predict/comm.py); within a node it plays
no part; a bad value is one clear error; the YAML key and the flag reach the job."""
from __future__ import annotations

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.errors import TrainplanError
from trainplan.predict.comm import NODE_NIC_BYTES_PER_S, collective_s, exposed_comm, \
    link_fraction, node_bytes_per_s, replica_all_reduce_s
from trainplan.spec import validate

from conftest import tiny_job

META = {"gradient_bytes": 2.0e9, "params_total": 1.0e9, "params_trainable": 1.0e9,
        "weight_bytes": 4.0e9, "largest_block_param_bytes": 0.1e9}


def test_the_jobs_network_is_bytes_a_second_a_node():
    assert node_bytes_per_s(tiny_job()) == NODE_NIC_BYTES_PER_S
    assert NODE_NIC_BYTES_PER_S * 8 / 1e9 == 1600          # eight 200 Gbit/s NICs
    assert node_bytes_per_s(tiny_job(internode_gbps=400)) == 50e9


def test_collectives_across_nodes_run_at_the_nodes_network():
    a = get_accelerator("a100")
    slow = 50e9                                            # 400 Gbit/s a node
    t = collective_s("all_gather", 1e9, 16, a, slow)
    assert t == pytest.approx(15 / 16 * 1e9 / (slow * link_fraction(a)))
    assert t == pytest.approx(4 * collective_s("all_gather", 1e9, 16, a))
    # within one node NVLink carries it whatever the NICs are
    assert collective_s("all_gather", 1e9, 8, a, slow) == collective_s("all_gather", 1e9, 8, a)
    assert replica_all_reduce_s(2e9, 16, 8, a, slow) == pytest.approx(2e9 / slow)


def test_a_slower_network_exposes_more_of_fsdp_and_says_what_it_assumed():
    a = get_accelerator("a100")

    def comm(n, gbps=None):
        job = tiny_job(strategy="fsdp", gpus=n, precision="bf16-amp", internode_gbps=gbps)
        return exposed_comm(job, a, META, n, 0.05, 0.1, 0.189)

    fast, slow = comm(16), comm(16, 400)
    assert slow[0] > fast[0]
    assert any("1,600 Gbit/s a node (assumed" in s for s in fast[2])
    assert any("400 Gbit/s a node (the job's internode_gbps)" in s for s in slow[2])
    # one node: the same time, and nothing said about a network it does not use
    one, one_slow = comm(8), comm(8, 400)
    assert one[0] == one_slow[0]
    assert not any("between nodes" in s for s in one[2] + one_slow[2])


@pytest.mark.parametrize("bad", [0, -400, float("nan"), float("inf"), 1e9])
def test_a_network_that_cannot_be_is_refused(bad):
    with pytest.raises(TrainplanError, match="internode_gbps must be a positive number"):
        validate(tiny_job(internode_gbps=bad))


def test_the_yaml_key_and_the_flag_reach_the_job(tmp_path):
    from trainplan.cli.common import job_from_args
    from trainplan.cli.main import build_parser
    from trainplan.jobfile import load_job
    f = tmp_path / "job.yaml"
    f.write_text("model: hf:openai-community/gpt2\nbatch_size: 4\nseq_len: 128\ngpus: 16\n"
                 "strategy: fsdp\ninternode_gbps: 400\n")
    assert load_job(f).internode_gbps == 400
    f.write_text("model: hf:openai-community/gpt2\ninternode_gbps: fast\n")
    with pytest.raises(TrainplanError, match="internode_gbps must be a number"):
        load_job(f)
    args = build_parser().parse_args(["estimate", "--model", "hf:openai-community/gpt2",
                                      "--gpus", "16", "--internode-gbps", "800"])
    assert job_from_args(args).internode_gbps == 800
