"""Physics checks of the step-time model on small traced models (GPT-2 124M)."""
from __future__ import annotations

import csv
import functools
import time
from importlib import resources

import pytest
import torch

from trainplan.accelerators import get_accelerator
from trainplan.precision import FP16_AMP
from trainplan.spec import Job, validate
from trainplan.predict.timing import (NODE_NIC_BYTES_PER_S, OpTable, collective_s, estimate_step_time,
                              link_fraction, load_efficiency, op_times, summarize)
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

GPT2 = "hf:openai-community/gpt2"
AMP = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}


def catalog_ids() -> list[str]:
    text = resources.files("trainplan.data").joinpath("accelerators.csv").read_text()
    return [r["id"] for r in csv.DictReader(text.splitlines())]


def job(precision="fp16-amp", batch=16, seq=1024, **kw):
    return validate(Job(model=GPT2, batch_size=batch, seq_len=seq, precision=precision,
                        optimizer="adamw", **kw))


@functools.lru_cache(maxsize=None)
def trace(precision="fp16-amp", batch=16, seq=1024):
    sem = KernelSemantics(attention="efficient", autocast_dtype=AMP.get(precision))
    return trace_step(job(precision, batch, seq), sem)


def step(accel, precision="fp16-amp", batch=16, **kw):
    return estimate_step_time(trace(precision, batch), get_accelerator(accel),
                              job(precision, batch, **kw))


def test_never_beats_peak_on_any_accelerator():
    for precision in ("fp16-amp", "fp32"):
        for acc in catalog_ids():
            st = step(acc, precision)
            assert st.mfu is None or 0 < st.mfu <= 1.0, (acc, precision, st.mfu)
            assert st.step_time_s > 0
            parts = st.breakdown_s
            assert set(parts) == {"compute", "memory_bound", "communication", "optimizer",
                                  "data_wait", "overhead"}
            assert st.step_time_s == pytest.approx(sum(parts.values()), rel=1e-9)


def test_all_accelerators_fast():
    tr = trace()
    j = job()
    accels = [get_accelerator(a) for a in catalog_ids()]
    t0 = time.perf_counter()
    for a in accels:
        estimate_step_time(tr, a, j)
    assert time.perf_counter() - t0 < 2.0


def test_doubling_batch_doubles_compute_bound_step():
    # GPT-2 in fp32 on a T4 (4.6 TFLOP/s sustained on CUDA cores) is compute-bound
    small, big = step("t4", "fp32", batch=16), step("t4", "fp32", batch=32)
    assert small.bound == "compute"
    assert 1.8 <= big.step_time_s / small.step_time_s <= 2.1


def test_pcie_t4_pair_scales_worse_than_nvlink_a100_pair():
    def speedup(acc):
        one = step(acc)
        two = step(acc, gpus=2, strategy="ddp")
        return two.samples_per_s / one.samples_per_s
    s_t4, s_a100 = speedup("t4"), speedup("a100-sxm4-40gb")
    assert s_t4 < s_a100 <= 2.0
    assert s_a100 > 1.9


def test_t4_fp32_much_slower_than_fp16_amp():
    assert step("t4", "fp32").step_time_s > 3 * step("t4", "fp16-amp").step_time_s


def test_p100_has_no_tensor_core_speedup():
    p100 = step("p100", "fp32").step_time_s / step("p100", "fp16-amp").step_time_s
    v100 = step("v100", "fp32").step_time_s / step("v100", "fp16-amp").step_time_s
    assert p100 <= 2.2          # fp16 on CUDA cores is 2x fp32 at best (18.7 vs 9.3 TFLOPS)
    assert v100 > p100 * 1.5


def test_all_reduce_closed_form():
    for acc in ("a100-sxm4-40gb", "t4", "tpu-v3-8"):
        a = get_accelerator(acc)
        for n in (2, 4, 8):
            got = collective_s("all_reduce", 1e9, n, a)
            want = 2 * (n - 1) / n * 1e9 / (a.interconnect_bytes_per_s * link_fraction(a))
            assert got == pytest.approx(want, rel=1e-12)
    assert collective_s("all_reduce", 1e9, 1, get_accelerator("t4")) == 0.0


def test_data_pipeline_bound():
    st = step("a100-sxm4-40gb", num_workers=2, samples_per_s_per_worker=10.0)
    assert st.bound == "data"
    assert st.samples_per_s == pytest.approx(20.0, rel=1e-6)
    # without workers (PyTorch's default 0) loading adds to every step instead of overlapping
    serial = step("a100-sxm4-40gb", samples_per_s_per_worker=10.0)
    fast = step("a100-sxm4-40gb")
    assert serial.step_time_s == pytest.approx(fast.step_time_s + 16 / 10.0, rel=1e-9)
    # a fast pipeline costs nothing
    assert step("a100-sxm4-40gb", num_workers=8, samples_per_s_per_worker=1e6).breakdown_s[
        "data_wait"] == 0.0


def test_tpu_reports_compile_time():
    assert step("tpu-v3-8", "bf16-amp").xla_compile_s > 0
    assert step("a100", "bf16-amp").xla_compile_s is None


def test_inter_node_ring_uses_the_node_nic_bandwidth():
    a = get_accelerator("a100-sxm4-80gb")
    one_node = collective_s("all_gather", 1e9, 8, a)
    assert one_node == pytest.approx(7 / 8 * 1e9 / (a.interconnect_bytes_per_s * 0.8))
    # 64 GPUs: one ring per NIC, each NIC carries 1/8 of it -> the node's 1600 Gbit/s bounds
    assert collective_s("all_gather", 1e9, 64, a) == pytest.approx(
        63 / 64 * 1e9 / (min(a.interconnect_bytes_per_s, NODE_NIC_BYTES_PER_S) * 0.8))


def test_depthwise_conv_backward_flops_closed_form():
    # FLOPs of a depthwise 3x3 conv: 2 N H W C k^2 forward; backward = grad_input + grad_weight
    from trainplan.trace.counters import _conv_backward_flops
    x = torch.empty(4, 32, 16, 16, device="meta")
    w = torch.empty(32, 1, 3, 3, device="meta")
    g = torch.empty(4, 32, 16, 16, device="meta")
    fwd = 2 * 4 * 16 * 16 * 32 * 9
    args = (g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 32, [True, True, False])
    assert _conv_backward_flops(args) == 2 * fwd
    args = args[:10] + ([False, True, False],)
    assert _conv_backward_flops(args) == fwd


def _table(flops, nbytes, family=0, dtype=1, phase=0, name="mm", group_channels=0):
    import numpy as np
    return OpTable(np.array([name], dtype=object), np.array([family]), np.array([dtype]),
                   np.array([phase]), np.array(["convolution" in name]),
                   np.array([float(flops)]), np.array([float(nbytes)]), np.array([1]),
                   np.array([group_channels]), meta={"channels_last": True})


def test_op_time_is_a_roofline():
    p = load_efficiency()
    a = get_accelerator("a100")
    # a big fp16 matmul: compute-bound, at most the measured matmul ceiling of the peak
    t, cb = op_times(_table(1e13, 1e8), a, FP16_AMP, p)
    assert cb[0] and 1e13 / t[0] <= 0.87 * a.fp16_tensor_flops
    assert 1e13 / t[0] > 0.5 * a.fp16_tensor_flops
    # an elementwise op: memory-bound, never faster than the bandwidth allows
    t, cb = op_times(_table(0, 4e9, family=2, name="add"), a, FP16_AMP, p)
    assert not cb[0] and 4e9 / t[0] <= a.memory_bandwidth_bytes_per_s
    # a depthwise convolution runs on CUDA cores: slower than the same FLOPs on tensor cores
    dense, _ = op_times(_table(1e12, 1e6, name="convolution", group_channels=64), a,
                        FP16_AMP, p)
    dw, _ = op_times(_table(1e12, 1e6, name="convolution", group_channels=1), a, FP16_AMP, p)
    assert dw[0] > dense[0]
    # NCHW tensor-core convolutions pay cuDNN's layout transposes; depthwise ones do not
    nchw = _table(1e6, 4e9, name="convolution", group_channels=64)
    nchw.meta["channels_last"] = False
    assert op_times(nchw, a, FP16_AMP, p)[0][0] > op_times(
        _table(1e6, 4e9, name="convolution", group_channels=64), a, FP16_AMP, p)[0][0]


def test_optimizer_step_is_memory_bound_over_states():
    # AdamW on GPT-2 (124M): the foreach step streams params, grads, exp_avg, exp_avg_sq
    st = step("a100-sxm4-80gb")
    a = get_accelerator("a100-sxm4-80gb")
    state_bytes = 124.4e6 * 4 * 4           # fp32 params + grads + two moments
    floor = 2 * state_bytes / a.memory_bandwidth_bytes_per_s    # read + write each once
    assert floor < st.breakdown_s["optimizer"] < 8 * floor


def test_host_overhead_floor_for_tiny_steps():
    # GPT-2 at batch 1, seq 64 on an H100: kernels are microseconds, the host issues each op
    p = load_efficiency()
    tiny = validate(Job(model=GPT2, batch_size=1, seq_len=64, precision="bf16-amp"))
    tr = trace_step(tiny, KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16))
    st = estimate_step_time(tr, get_accelerator("h100-sxm"), tiny)
    n_ops = int(summarize(tr).count.sum())
    assert st.step_time_s >= n_ops * p["host_op_s"] * (1 - 1e-9)
    assert st.breakdown_s["overhead"] > 0.5 * st.step_time_s


def test_strategies_order():
    # same per-device work: DDP overlaps its all-reduce with backward, DataParallel pays
    # broadcast + gather through GPU 0 and one GIL for every device's launches
    ddp = step("v100", gpus=4, strategy="ddp")
    dp = step("v100", gpus=4, strategy="dp")
    assert dp.samples_per_s < ddp.samples_per_s
    # FSDP gathers parameters every micro-batch: more traffic than DDP's one all-reduce
    fsdp = step("t4", gpus=2, strategy="fsdp")
    ddp_t4 = step("t4", gpus=2, strategy="ddp")
    assert fsdp.breakdown_s["communication"] >= ddp_t4.breakdown_s["communication"]


def test_tpu_units_are_eight_devices():
    for acc in ("tpu-v2-8", "tpu-v3-8", "tpu-v5e-8"):
        st = step(acc, "bf16-amp", gpus=1, strategy="ddp")
        assert st.n_devices == 8
        assert st.samples_per_s == pytest.approx(8 * 16 / st.step_time_s)
