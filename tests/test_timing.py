"""Physics checks of the step-time model on small traced models (GPT-2 124M).

How long the model takes over every accelerator is a benchmark, run, not asserted on here:
`python scripts/bench_estimate.py` (its time-only column; the target is 2 s a job)."""
from __future__ import annotations

import csv
import functools
from importlib import resources

import pytest
import torch

from trainplan.accelerators import get_accelerator
from trainplan.precision import FP16_AMP
from trainplan.spec import Job, validate
from trainplan.predict.comm import NODE_NIC_BYTES_PER_S, collective_s, link_fraction
from trainplan.predict.optable import OpTable
from trainplan.predict.time_params import bundled
from trainplan.predict.timing import estimate_step_time, op_times, summarize
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
    # fp16 GEMMs accumulate in fp32 on CUDA cores: only the halved bytes of memory-bound ops
    # speed up, never the arithmetic (18.7 TFLOPS half2 is fp16-accumulate, unused by PyTorch)
    assert p100 <= 1.6
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
    from trainplan.trace.ops import _conv_backward_flops
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
    p = bundled()
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


def _grouped_conv(group_channels: int, layout: int, old_cudnn: bool) -> OpTable:
    """One fp16 grouped 3x3 convolution's forward: 8 groups, 8 x 56 x 56 output pixels."""
    import numpy as np
    from trainplan.trace.shapes import NCHW, NHWC
    assert layout in (NCHW, NHWC)
    g, m, n, k = 8, 8 * 56 * 56, group_channels, group_channels * 9
    shape = np.empty(1, dtype=object)
    shape[0] = (g, m, n, k, layout)
    return OpTable(np.array(["convolution"], dtype=object), np.array([0]), np.array([1]),
                   np.array([0]), np.array([True]), np.array([2.0 * g * m * n * k]),
                   np.array([4e6]), np.array([1]), np.array([group_channels]), shape,
                   meta={"channels_last": layout == NHWC, "cudnn_grouped_direct": old_cudnn})


def test_old_cudnn_runs_wide_channels_last_groups_on_direct_kernels():
    # cuDNN 8.0-8.3 (KernelSemantics.cudnn_grouped_direct): a channels-last grouped convolution
    # of more than 32 channels a group on its direct kernels, at gdirect_emax of the FP32 peak
    from trainplan.predict.timing import _grouped_direct, kernel_classes
    from trainplan.trace.shapes import NCHW, NHWC
    import dataclasses
    p = dataclasses.replace(bundled(), gdirect_emax=0.1)     # about timm's RTX 3090 tables
    a = get_accelerator("rtx-3090")
    fp32 = a.fp32_flops * a.sustained_clock_fraction

    def seconds(gc, layout, old):
        return op_times(_grouped_conv(gc, layout, old), a, FP16_AMP, p)[0][0]

    wide = _grouped_conv(48, NHWC, True)
    assert _grouped_direct(wide, kernel_classes(wide)).tolist() == [True]
    assert seconds(48, NHWC, True) == pytest.approx(
        wide.flops[0] / (fp32 * p.grouped_direct_emax) + p.kernel_s, rel=1e-9)
    assert seconds(48, NHWC, True) > 2 * seconds(48, NHWC, False)     # tensor cores today
    # 32 channels a group, NCHW, or today's releases: the tensor-core implicit GEMM as before
    for gc, layout, old in ((32, NHWC, True), (48, NCHW, True), (48, NHWC, False)):
        t = _grouped_conv(gc, layout, old)
        assert not _grouped_direct(t, kernel_classes(t)).any()
        assert seconds(gc, layout, old) == seconds(gc, layout, False)


def test_fp32_matmuls_run_at_the_measured_cuda_core_ceiling_and_convolutions_at_cudnns():
    # fp32 without TF32 (V100; torch.mm everywhere since 1.12): a matmul at the GPU's best
    # measured FP32 torch.mm (efficiency.json fp32_ceiling), the median measured one where the
    # GPU has none; a convolution at cuDNN's CUDA-core fraction (cuda_emax, fitted)
    import dataclasses
    from trainplan.precision import FP32
    p = dataclasses.replace(bundled(), cuda_emax=0.9, fp32_emax=0.7,
                            fp32_ceiling={"v100-sxm2-16gb": 0.8})
    flops = 1e13

    def rate(gpu, **kw):          # an op without a traced shape: FLOPs / rate + one wave's time
        a = get_accelerator(gpu)
        t = op_times(_table(flops, 1e6, dtype=0, **kw), a, FP32, p)[0][0]
        return flops / (t - p.tile_s - p.kernel_s) / (a.fp32_flops * a.sustained_clock_fraction)

    assert rate("v100-sxm2-16gb") == pytest.approx(0.8, rel=1e-9)
    assert rate("titan-rtx") == pytest.approx(0.7, rel=1e-9)              # not measured
    assert rate("v100-sxm2-16gb", name="convolution", group_channels=64) == pytest.approx(
        0.9, rel=1e-9)
    # the bundled table: measured for the GPUs the validation runs on, each below the peak
    b = bundled()
    for gpu in ("v100-sxm2-16gb", "a100-sxm4-80gb", "h100-sxm", "rtx-3090", "rtx-4090"):
        assert 0.5 < b.fp32_ceiling[gpu] <= 1.0
    assert b.fp32_matmul_ceiling("titan-rtx") == b.fp32_emax


def test_optimizer_step_is_memory_bound_over_states():
    # AdamW on GPT-2 (124M): the foreach step streams params, grads, exp_avg, exp_avg_sq
    st = step("a100-sxm4-80gb")
    a = get_accelerator("a100-sxm4-80gb")
    state_bytes = 124.4e6 * 4 * 4           # fp32 params + grads + two moments
    floor = 2 * state_bytes / a.memory_bandwidth_bytes_per_s    # read + write each once
    assert floor < st.breakdown_s["optimizer"] < 8 * floor


def test_host_overhead_floor_for_tiny_steps():
    # GPT-2 at batch 1, seq 64 on an H100: kernels are microseconds, the host issues each op,
    # so the step takes at least the host's time to issue every kernel (predict/host.py)
    from trainplan.predict.host import issue_times
    tiny = validate(Job(model=GPT2, batch_size=1, seq_len=64, precision="bf16-amp"))
    tr = trace_step(tiny, KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16))
    st = estimate_step_time(tr, get_accelerator("h100-sxm"), tiny)
    host = float(issue_times(summarize(tr), bundled()).sum())
    assert st.step_time_s >= host * (1 - 1e-9)
    assert st.breakdown_s["overhead"] > 0          # the device waits for the host


def test_strategies_order():
    # same per-device work: DDP overlaps its all-reduce with backward, DataParallel pays
    # broadcast + gather through GPU 0 and one GIL for every device's launches
    ddp = step("v100", gpus=4, strategy="ddp")
    dp = step("v100", gpus=4, strategy="dp")
    assert dp.samples_per_s < ddp.samples_per_s
    # FSDP gathers parameters every micro-batch, and reduce-scatters the gradients on each
    # that syncs: the last only under no_sync (accelerate's default), every one with
    # sync_each_batch; DDP all-reduces once a step (no_sync) unless each micro-batch syncs
    def comm(strategy, accum, **kw):
        return step("t4", gpus=2, strategy=strategy, grad_accum=accum,
                    **kw).breakdown_s["communication"]
    assert comm("fsdp", 4, sync_each_batch=True) >= 3.9 * comm("fsdp", 1) > 0
    assert comm("fsdp", 1) < comm("fsdp", 4) < comm("fsdp", 4, sync_each_batch=True)
    assert comm("ddp", 4) == pytest.approx(comm("ddp", 1))
    assert comm("ddp", 4, sync_each_batch=True) > 2 * comm("ddp", 1)


def test_tpu_units_are_eight_devices():
    for acc in ("tpu-v2-8", "tpu-v3-8", "tpu-v5e-8"):
        st = step(acc, "bf16-amp", gpus=1, strategy="ddp")
        assert st.n_devices == 8
        assert st.samples_per_s == pytest.approx(8 * 16 / st.step_time_s)


def _physical_rate(a, precision, dtype_code: int, conv: bool, attention: bool) -> float:
    """The fastest rate the hardware offers for what a kernel computes in (catalog figures, no
    model parameters): fp32 runs in TF32 only where the precision allows it (tf32; cuDNN's
    convolutions under fp32), fp16 on tensor cores or else the FP32 FMA units, bf16 likewise."""
    tf32 = precision.compute == "tf32" or (conv and precision.compute == "fp32")
    if dtype_code == 0 and attention and a.kind == "gpu":      # 3xTF32 whatever allow_tf32 says
        return max((a.tf32_flops or 0) / 3, a.fp32_flops)
    if dtype_code == 0:
        return max(a.fp32_flops, a.tf32_flops or 0) if tf32 else a.fp32_flops
    if dtype_code == 1:
        return a.fp16_tensor_flops or (a.bf16_flops if a.kind == "tpu" else 0) or a.fp32_flops
    return (a.bf16_flops if a.supports_bf16 else 0) or a.fp32_flops


def test_no_op_beats_its_roofline_on_any_accelerator_or_precision():
    """Every kernel class (matmul, convolution, depthwise, attention, norm, elementwise,
    optimizer), every dtype, every size: FLOP/s within the rate of the dtype it computes in and
    bytes/s within the memory bandwidth, on every catalog accelerator and precision. The rate is
    the catalog's at the spec clock, or what the card was measured to reach where its boost clock
    runs above it (the measured matmul ceiling over 1: RTX 3090 1.07, RTX 4090 1.02)."""
    import numpy as np
    from trainplan.precision import ALL as PRECISIONS
    p = bundled()
    names = ["mm", "convolution", "convolution", "_scaled_dot_product_efficient_attention",
             "native_layer_norm", "add", "_foreach_add"]
    fams = [0, 0, 0, 1, 2, 2, 2]
    groups = [0, 64, 1, 0, 0, 0, 0]
    rows = [(n, f, g, dt, ph, fl, by) for n, f, g in zip(names, fams, groups)
            for dt in (0, 1, 2) for ph in (0, 1, 2)
            for fl, by in ((1e6, 1e4), (1e9, 1e6), (1e13, 1e8), (0, 4e9), (1e10, 1e10))]
    cols = list(zip(*rows))
    table = OpTable(np.array(cols[0], dtype=object), np.array(cols[1]), np.array(cols[3]),
                    np.array(cols[4]), np.array(["convolution" in n for n in cols[0]]),
                    np.array(cols[5], float), np.array(cols[6], float), np.ones(len(rows), int),
                    np.array(cols[2]), meta={"channels_last": True})
    for acc in catalog_ids():
        a = get_accelerator(acc)
        for prec in PRECISIONS:
            t, _ = op_times(table, a, prec, p)
            assert (t > 0).all()
            rate = np.array([_physical_rate(a, prec, d, c, f == 1 and ph != 2)  # no attention
                             for d, c, f, ph in zip(table.dtype, table.conv, table.family,
                                                    table.phase)])       # in optimizer steps
            clock = max(1.0, p.ceiling(acc))
            assert (table.flops / t <= rate * clock * (1 + 1e-9)).all(), (acc, prec.name)
            assert (table.bytes / t <= a.memory_bandwidth_bytes_per_s).all(), (acc, prec.name)


def test_p100_fp16_amp_never_beats_its_fp32_peak():
    st = step("p100", "fp16-amp")
    flops = summarize(trace("fp16-amp")).meta["model_flops"]
    assert flops / st.step_time_s <= get_accelerator("p100").fp32_flops


def _scaling(acc: str, counts, strategy: str, global_batch: int | None):
    """Samples/s at each GPU count: weak scaling (fixed micro-batch, accumulation 1) or strong
    scaling (fixed global batch of micro-batches of 1, accumulation global / n)."""
    tr = trace("bf16-amp" if acc != "t4" else "fp16-amp", 1, 1024)
    prec = "bf16-amp" if acc != "t4" else "fp16-amp"
    out = []
    for n in counts:
        accum = 1 if global_batch is None else global_batch // n
        out.append(estimate_step_time(tr, get_accelerator(acc),
                                      job(prec, 1, 1024, gpus=n, strategy=strategy,
                                          grad_accum=accum)))
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "hsdp", "zero2"])
def test_weak_and_strong_scaling_monotone_and_bounded_by_the_link(strategy):
    counts = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    a = get_accelerator("h100-sxm")
    for global_batch in (None, 512):
        sts = _scaling("h100-sxm", counts, strategy, global_batch)
        total = [s.samples_per_s for s in sts]
        per_gpu = [t / n for t, n in zip(total, counts)]
        # more GPUs never lower the total throughput; a replicated strategy never raises the
        # per-GPU one (a sharded one may: each rank updates 1/n of the optimizer state), and no
        # GPU ever beats its forward and backward alone
        assert all(b >= a_ * (1 - 1e-9) for a_, b in zip(total, total[1:])), total
        if strategy == "ddp":
            assert all(b <= a_ * (1 + 1e-9) for a_, b in zip(per_gpu, per_gpu[1:])), per_gpu
        for s, n, g in zip(sts, counts, per_gpu):
            work = s.breakdown_s["compute"] + s.breakdown_s["memory_bound"]
            samples = (512 // n if global_batch else 1)
            assert g <= samples / work * (1 + 1e-9)
            comm = s.breakdown_s["communication"]
            assert comm >= 0
            if n > 1:
                # exposed communication never exceeds what the link needs for the whole payload
                # (every collective of the step, nothing hidden), at the slowest link in use
                grads = summarize(trace("bf16-amp", 1, 1024)).meta["gradient_bytes"]
                k = max(1, 512 // n) if global_batch else 1
                worst = (3 * k + 2) * collective_s("all_reduce", grads, n, a)
                assert comm <= worst, (strategy, n, comm, worst)


def test_crossing_nodes_costs_ddp_more_than_staying_inside_one():
    st8, st16 = _scaling("h100-sxm", [8, 16], "ddp", None)
    assert st16.samples_per_s / 16 <= st8.samples_per_s / 8


def test_host_runs_ahead_of_the_device_in_its_queue():
    """One large kernel first, then many small ones: the host issues the small ones while the
    device runs the large one, so the step is the device's time plus only what the host still
    had to issue after it -- not the sum of both, and never less than either."""
    import numpy as np
    from trainplan.predict.host import host_costs
    p = bundled()
    a = get_accelerator("h100-sxm")
    big, small = 1e13, 100
    table = OpTable(np.array(["mm", "add"], dtype=object), np.array([0, 2]), np.array([2, 2]),
                    np.array([0, 0]), np.array([False, False]), np.array([big, 0.0]),
                    np.array([1e6, 1e3]), np.array([1, small]), np.array([0, 0]),
                    meta={"channels_last": True, "model_flops": big, "gradient_bytes": 0.0,
                          "params_total": 1, "params_trainable": 1, "weight_bytes": 1.0,
                          "batch_size": 1, "tokens_per_sample": None})
    j = validate(Job(model=GPT2, batch_size=1, seq_len=64, precision="bf16-amp"))
    st = estimate_step_time(table, a, j)
    t_dev, _ = op_times(table, a, j.precision, p)
    h = host_costs(p)["forward"]
    device = float((t_dev * table.count).sum())
    # the big kernel is issued after h and runs for t_big; the host has issued every small one
    # before it ends, so they run back to back behind it: h + the device's time
    assert small * h < float(t_dev[0])
    assert st.step_time_s == pytest.approx(h + device, rel=1e-6)
    assert st.step_time_s < device + (1 + small) * h


def test_queue_against_a_step_by_step_simulation():
    """The closed form (host.run_queue, StepQueue.repeated) equals simulating the queue kernel by
    kernel: issue at H_i, start at max(H_i, previous end), with syncs draining it."""
    import numpy as np
    from trainplan.predict.host import run_queue
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        h, d = rng.exponential(1.0, n), rng.exponential(1.0, n) * rng.choice([0.1, 1, 10])
        sync = rng.random(n) < 0.1
        t_host = end = 0.0
        for i in range(n):
            t_host += h[i]
            end = max(t_host, end) + d[i]
            if sync[i]:
                t_host = end
        assert run_queue(h, d, sync).seconds == pytest.approx(end, rel=1e-9)
        k = int(rng.integers(1, 5))
        t_host = end = 0.0
        for _ in range(k):
            for i in range(n):
                t_host += h[i]
                end = max(t_host, end) + d[i]
        assert run_queue(h, d).repeated(k) == pytest.approx(end, rel=1e-9)


def test_fp16_loss_scaling_costs_an_unscale_pass():
    """GradScaler.unscale_ reads and writes every gradient once: fp16 AMP pays it, bf16 not."""
    a = get_accelerator("a100-sxm4-80gb")
    tr = trace("fp16-amp")
    fp16 = estimate_step_time(tr, a, job("fp16-amp")).breakdown_s["optimizer"]
    bf16 = estimate_step_time(tr, a, job("bf16-amp")).breakdown_s["optimizer"]
    grads = summarize(tr).meta["gradient_bytes"]
    assert fp16 - bf16 == pytest.approx(
        2 * grads / (a.memory_bandwidth_bytes_per_s * bundled().bw_eff), rel=1e-6)


def test_op_table_puts_repeated_records_back_block_after_block():
    """optable.summarize: a record held more than once (a stitched trace's block copies: the
    same objects) keeps its first place, its copies run after the last repeated record of its
    phase, block after block, and each distinct record is one row counted as often as it runs;
    records repeated unevenly (a multi-tensor op grown for some blocks only) run while they
    have copies left; records with no work are left out of the order and the rows."""
    from types import SimpleNamespace

    import numpy as np
    from trainplan.trace.facts import OpRecord, TraceDerived

    def rec(name, phase, flops=1.0, host=0):
        return OpRecord(name, "other", phase, flops, 8.0, "float32", "m", host_ops=host,
                        host_modules=3 * host)

    emb, a, b, c, head = (rec(n, "forward", f, h) for n, f, h in
                          (("emb", 1, 0), ("a", 2, 1), ("b", 3, 0), ("c", 4, 2), ("head", 5, 0)))
    ga, gb, opt = rec("ga", "backward", 6), rec("gb", "backward", 7), rec("adam", "optimizer", 8)
    idle = OpRecord("view", "other", "forward", 0.0, 0.0, "float32", "m")
    ops = [emb, a, idle, b, c, head, gb, ga, opt] + [a, b, gb, ga] * 2 + [c]
    tr = SimpleNamespace(ops=ops, derived=TraceDerived(), model_flops=0, gradient_bytes=0,
                         params_total=0, params_trainable=0, weight_bytes=0,
                         largest_block_param_bytes=0, moe_dispatch_elements=0, batch_size=1,
                         tokens_per_sample=1, semantics=KernelSemantics())
    table = summarize(tr)
    order = [table.name[i] for i in table.seq]
    # forward: a and b three times, c twice (its one copy in the first round of copies)
    assert order == ["emb", "a", "b", "c", "a", "b", "c", "a", "b", "head",
                     "gb", "ga", "gb", "ga", "gb", "ga", "adam"]
    assert dict(zip(table.name, table.count)) == {"emb": 1, "a": 3, "b": 3, "c": 2, "head": 1,
                                                  "gb": 3, "ga": 3, "adam": 1}
    assert [int(h) for h in table.seq_host] == [0, 1, 0, 2, 1, 0, 2, 1, 0, 0,
                                                0, 0, 0, 0, 0, 0, 0]
    assert [int(m) for m in table.seq_modules] == [3 * int(h) for h in table.seq_host]
    again = type(table).from_dict(table.to_dict())
    assert np.array_equal(again.seq_modules, table.seq_modules)
    assert summarize(tr) is table                          # kept on the trace


def test_op_table_rows_are_those_of_keying_every_record():
    """optable `_rows` tells records apart by their fields as they are, then keys each distinct
    field tuple once: the same rows, in the same order, as keying every record (`_key`), where
    raw fields that differ share a key (int64 and bool are both dtype code 3; 1 and 1.0 FLOPs
    are one value), where records differ only outside the key (module, host ops), and where
    records have no work; on a real trace too."""
    from trainplan.predict.optable import _key, _rows
    from trainplan.trace.facts import OpRecord

    def each(records):
        index, keys, rows = {}, [], []
        for o in records:
            if o.flops == 0 and o.bytes == 0:
                rows.append(-1)
                continue
            k = _key(o.name, o.family, o.dtype, o.phase, o.flops, o.bytes, o.group_channels,
                     o.shape, o.recompute, o.cast)
            rows.append(index.setdefault(k, len(keys)))
            if rows[-1] == len(keys):
                keys.append(k)
        return rows, keys

    made = [OpRecord("sum", "other", "forward", 1.0, 8.0, "int64", "a"),
            OpRecord("mm", "matmul", "forward", 4.0, 8.0, "float16", "a", shape=(2, 2, 2)),
            OpRecord("sum", "other", "forward", 1, 8.0, "bool", "b", host_ops=3),
            OpRecord("view", "other", "forward", 0.0, 0.0, "float32", "a"),
            OpRecord("mm", "matmul", "forward", 4.0, 8.0, "float16", "b", shape=(2, 2, 2)),
            OpRecord("mm", "matmul", "backward", 4.0, 8.0, "float16", "a", shape=(2, 2, 2)),
            OpRecord("convolution", "matmul", "forward", 4.0, 8.0, "bfloat16", "c",
                     group_channels=1),
            # the same add, once through the vectorized loop and once through the casting one
            OpRecord("add", "other", "forward", 0.0, 8.0, "bfloat16", "a"),
            OpRecord("add", "other", "forward", 0.0, 8.0, "bfloat16", "a", cast=True)]
    real = list(dict.fromkeys(trace("bf16-amp", 4).ops))
    for records in (made, real):
        of_record, keys = _rows(records)
        rows, expect = each(records)
        assert of_record.tolist() == rows and keys == expect
    assert _rows(made)[0].tolist() == [0, 1, 0, -1, 1, 2, 3, 4, 5]


def test_a_table_timed_again_is_read_from_its_memo_and_only_for_the_same_inputs():
    """timing.py `_timed` keeps each table's device times and queue per accelerator, precision,
    parameters and queue settings (and the device times alone, shared by every queue setting):
    the same step time as made afresh, another calibration's parameters or another accelerator
    never served, and at most MEMO_ENTRIES kept (a fit times one table under thousands of
    parameter sets)."""
    from dataclasses import replace

    from trainplan.predict.optable import MEMO_ENTRIES
    from trainplan.predict.timing import _timed
    tr, a100, t4 = trace("fp16-amp", 16), get_accelerator("a100-80gb"), get_accelerator("t4")
    table = summarize(tr)
    table.memo.timed.clear()
    first = step("a100-80gb")
    assert len(table.memo.timed) == 2                      # the device times, and the queue
    again = step("a100-80gb")
    assert len(table.memo.timed) == 2 and again == first
    # another host (a platform's CPU): the same device times, another queue
    prec = job().precision
    fast, slow = (_timed(table, a100, prec, bundled(), 1, speed, 1) for speed in (1.0, 0.25))
    assert slow[0] is fast[0] and slow[2].micro_batch.host_s > fast[2].micro_batch.host_s
    table.memo.timed.clear()
    assert step("a100-80gb") == first
    fresh = estimate_step_time(replace(tr, ops=list(tr.ops)), a100, job())   # no memo at all
    assert fresh == first
    # the arrays kept are read-only: no reader may change what another reads
    t_dev = next(iter(table.memo.timed.values()))[3][0]
    with pytest.raises(ValueError):
        t_dev[0] = 0.0
    # other parameters (a calibration), another accelerator: made, not read
    other = replace(bundled(), bw_eff=bundled().bw_eff * 0.5)
    slower = estimate_step_time(tr, a100, job(), calibration=other)
    assert slower.step_time_s > first.step_time_s
    assert step("t4").step_time_s != first.step_time_s
    assert len(table.memo.timed) == 6
    for i in range(MEMO_ENTRIES + 5):
        estimate_step_time(tr, t4, job(), calibration=replace(bundled(), bw_eff=0.5 + i / 1000))
    assert len(table.memo.timed) == MEMO_ENTRIES
    assert step("a100-80gb") == first


def test_a_checkpointed_blocks_rerun_costs_the_host_its_measured_share():
    """Full checkpointing reruns each block's forward in the backward, and torch.utils.checkpoint
    does more than rerun it (a hook on every saved tensor, the rerun's bookkeeping and checks):
    with that measured (`checkpoint_s`, scripts/host_paths.py; Python, no launch in it, so not
    scaled), each rerun kernel costs the host a forward op's dispatch plus it; without it (the
    bundled fit, docs/validation.md) a backward op's, as before. The step's queue (its fast path,
    host.step_queue) charges exactly what issue_times does kernel by kernel."""
    import dataclasses
    import numpy as np
    from trainplan.predict.host import host_costs, issue_times, step_queue
    tiny = validate(Job(model=GPT2, batch_size=1, seq_len=64, precision="bf16-amp",
                        grad_checkpointing="full"))
    table = summarize(trace_step(tiny, KernelSemantics(attention="flash",
                                                       autocast_dtype=torch.bfloat16)))
    rerun = table.recompute[table.seq]
    backward = ~rerun & (table.phase[table.seq] == 1)
    assert rerun.sum() > 0 and not (rerun & (table.phase[table.seq] != 1)).any()
    base = bundled()
    assert base.host_dispatch.checkpoint_s is None
    measured = dataclasses.replace(base, host_dispatch=dataclasses.replace(
        base.host_dispatch, checkpoint_s=31.5e-6))
    zero = np.zeros(len(table.name))
    for p, rerun_cost in ((base, host_costs(base)["backward"]),
                          (measured, host_costs(measured)["forward"] + 31.5e-6)):
        c = host_costs(p)
        assert c["recompute"] == pytest.approx(rerun_cost)
        host = issue_times(table, p)
        views = table.seq_host * np.where(backward, c["backward_view"], c["view"]) + \
            table.seq_modules * c["module"]
        assert np.allclose(host[rerun] - views[rerun], c["recompute"])
        assert np.allclose(host[backward] - views[backward], c["backward"])
        assert step_queue(table, zero, p).seconds == pytest.approx(float(host.sum()), rel=1e-9)


def test_the_host_runs_the_models_modules_and_a_backward_view_as_a_backward_op():
    """Between kernels the host runs the model's own code: each kernel carries the modules the
    forward (or a checkpointed block's rerun) entered since the kernel before (the trace's
    `host_modules`), none in the backward, which runs no module code; with `module_s` each
    costs the host that (Python, no launch: not scaled), and with `backward_view_s` a view in
    the backward costs a backward op (predict/host.py). Without them (None, the bundled fit)
    neither costs anything more. The step's
    queue (its fast path) charges exactly what issue_times does kernel by kernel."""
    import dataclasses
    import numpy as np
    from trainplan.predict.host import host_costs, issue_times, step_queue
    tiny = validate(Job(model=GPT2, batch_size=1, seq_len=64, precision="bf16-amp"))
    table = summarize(trace_step(tiny, KernelSemantics(attention="flash",
                                                       autocast_dtype=torch.bfloat16)))
    ph = table.phase[table.seq]
    fwd, bwd = ph == 0, ph == 1
    linears = 4 * 12 + 1          # c_attn, c_proj, c_fc, mlp c_proj a block; lm_head
    assert table.seq_modules[fwd].sum() > linears + 2 * 12      # each entered, ln_1 and ln_2 too
    assert table.seq_modules[~fwd].sum() == 0
    assert table.seq_host[bwd].sum() > 0
    base = bundled()
    none = dataclasses.replace(base, host_dispatch=dataclasses.replace(
        base.host_dispatch, module_s=None, backward_view_s=None))
    both = dataclasses.replace(base, host_dispatch=dataclasses.replace(
        base.host_dispatch, module_s=9.4e-6, backward_view_s=base.host_dispatch.backward_op_s))
    zero = np.zeros(len(table.name))
    h0, h1 = issue_times(table, none), issue_times(table, both)
    c0, c1 = host_costs(none), host_costs(both)
    assert c0["module"] == 0 and c0["backward_view"] == c0["view"]
    assert c1["module"] == pytest.approx(9.4e-6)        # Python: not scaled by host_scale
    assert c1["backward_view"] == pytest.approx(c1["backward"] - base.cuda_launch_s)
    extra = table.seq_modules * c1["module"] + \
        np.where(bwd, table.seq_host * (c1["backward_view"] - c1["view"]), 0.0)
    assert np.allclose(h1 - h0, extra)
    assert (h1 - h0)[fwd].sum() > 0 and (h1 - h0)[bwd].sum() > 0
    for p, host in ((none, h0), (both, h1)):
        assert step_queue(table, zero, p).seconds == pytest.approx(float(host.sum()), rel=1e-9)
