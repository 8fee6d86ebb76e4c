"""Kernel shapes in the trace (trace/shapes.py) and kernel time from shape (predict/kernels.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainplan.accelerators import get_accelerator, kernel_facts, load_accelerators
from trainplan.predict import kernels
from trainplan.predict.optable import summarize
from trainplan.predict.time_params import bundled
from trainplan.spec import Job, validate
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.shapes import NCHW, NHWC, NN, NT, TN, gemms, kernel_shape, on_line
from trainplan.trace.tracer import trace_step

aten = torch.ops.aten


def test_matmul_shapes_and_layouts():
    a, b = torch.empty(64, 32, device="meta"), torch.empty(32, 16, device="meta")
    assert kernel_shape(aten.mm.default, (a, b), {}) == (1, 64, 16, 32, NN)
    # autograd hands a linear layer's weight as a transposed view: NT; its input's TN
    w = torch.empty(16, 32, device="meta")
    assert kernel_shape(aten.mm.default, (a, w.t()), {}) == (1, 64, 16, 32, NT)
    assert kernel_shape(aten.mm.default, (a.t(), torch.empty(64, 8, device="meta")),
                        {}) == (1, 32, 8, 64, TN)
    bias = torch.empty(16, device="meta")
    assert kernel_shape(aten.addmm.default, (bias, a, b), {}) == (1, 64, 16, 32, NN)
    q, k = torch.empty(6, 128, 64, device="meta"), torch.empty(6, 64, 128, device="meta")
    assert kernel_shape(aten.bmm.default, (q, k), {}) == (6, 128, 128, 64, NN)


def test_convolution_gemms_forward_and_backward():
    """cuDNN's implicit GEMMs: forward (N Ho Wo) x C_out x (C_in/g R S); the data gradient
    (N H W) x C_in x (C_out/g R S); the weight gradient C_out x (C_in/g R S) x (N Ho Wo)."""
    x = torch.empty(2, 8, 16, 16, device="meta")
    w = torch.empty(32, 4, 3, 3, device="meta")            # groups = 2
    args = (x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 2)
    assert kernel_shape(aten.convolution.default, args, {}) == (2, 2 * 8 * 8, 16, 36, NCHW)
    g = torch.empty(2, 32, 8, 8, device="meta")
    bwd = (g, x, w, [32], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [True, True, False])
    sh = kernel_shape(aten.convolution_backward.default, bwd, {})
    # stride 2: each input pixel gathers 9 / 4 of the taps on average (16 x 9 / 4 = 36)
    assert gemms(sh) == [(2, 2 * 16 * 16, 4, 36, NCHW), (2, 16, 36, 2 * 8 * 8, NCHW)]
    cl = x.to(memory_format=torch.channels_last)
    assert kernel_shape(aten.convolution.default, (cl,) + args[1:], {})[-1] == NHWC
    # each GEMM does about the forward's FLOPs (the counter's convolution_backward formula)
    fwd = 2 * 2 * 8 * 8 * 32 * 4 * 9
    for gm in gemms(sh):
        assert 2 * np.prod(gm[:4]) == pytest.approx(fwd, rel=0.02)
    # a 1x1 convolution of stride 2 (a ResNet downsample): a quarter of the input pixels
    w1 = torch.empty(16, 8, 1, 1, device="meta")
    g1 = torch.empty(2, 16, 8, 8, device="meta")
    sh = kernel_shape(aten.convolution_backward.default,
                      (g1, x, w1, [16], [2, 2], [0, 0], [1, 1], False, [0, 0], 1,
                       [True, True, False]), {})
    for gm in gemms(sh):
        assert 2 * np.prod(gm[:4]) == 2 * 2 * 8 * 8 * 16 * 8


def test_attention_and_foreach_shapes():
    q = torch.empty(2, 8, 128, 64, device="meta")
    kv = torch.empty(2, 8, 256, 64, device="meta")
    sh = kernel_shape(aten._scaled_dot_product_efficient_attention.default,
                      (q, kv, kv, None, True, 0.0, True), {})
    assert sh == (2, 8, 8, 128, 256, 64, 64, 1, 0)
    bias = torch.empty(2, 8, 128, 256, device="meta")
    sh = kernel_shape(aten._scaled_dot_product_efficient_attention.default,
                      (q, kv, kv, bias, True), {"is_causal": False})
    assert sh[-2:] == (0, 1)
    ts = [torch.empty(3, device="meta")] * 5
    assert kernel_shape(aten._foreach_addcdiv_.Scalar, (ts, ts, ts), {"value": 1.0}) == (5, 3)
    assert kernel_shape(aten.add.Tensor, (q, q), {}) == ()


def test_a_traced_step_carries_its_kernel_shapes():
    job = validate(Job(model="hf:openai-community/gpt2", batch_size=2, seq_len=64,
                       precision="bf16-amp"))
    tr = trace_step(job, KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16),
                    depth=2)
    mm = [o for o in tr.ops if o.family == "matmul"]
    assert mm and all(o.shape for o in mm)
    for o in mm:            # each GEMM's FLOPs are the op's
        assert sum(2.0 * np.prod(g[:4]) for g in gemms(o.shape)) == pytest.approx(o.flops)
    attn = [o for o in tr.ops if o.family == "attention"]
    assert attn and all(o.shape[:6] == (2, 12, 12, 64, 64, 64) for o in attn)
    assert sum(o.host_ops for o in tr.ops) > 0          # the views between kernels


def test_shapes_read_off_two_micro_batches_are_the_real_ones():
    """The interpolated step's shapes (trace/derive/interpolate.py, trace/shapes.on_line) equal a
    real trace's at that micro-batch, op by op."""
    from trainplan.trace.derive.interpolate import trace_between
    sem = KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16)

    def tr(b):
        return trace_step(validate(Job(model="hf:openai-community/gpt2", batch_size=b,
                                       seq_len=32, precision="bf16-amp")), sem, depth=2)
    lo, hi, real = tr(2), tr(6), tr(4)
    mid = trace_between(lo, hi, 4)
    assert [o.shape for o in mid.ops] == [o.shape for o in real.ops]
    assert on_line((1, 2, 3), (1, 6, 3), 0.5) == (1, 4, 3)


def test_every_catalog_gpu_has_its_sms():
    """Every GPU has a row; only a product whose SM count no source gives leaves it empty
    (its notes say so), and is timed without wave quantisation."""
    for a in load_accelerators().values():
        if a.kind == "gpu":
            f = kernel_facts(a)
            assert f is not None, a.id
            assert (f.sm_count or 0) > 0 or "not" in f.notes, a.id


P_DEVICE, SMS = 989e12 * 0.8, 132        # an H100's bf16 rate at its ceiling


def _t(b, m, n, k, p=None):
    p = p or bundled()
    grid = kernels.gemm_grid(np.array([[b, m, n, k]], float), SMS)
    return float(kernels.gemm_seconds(grid, np.array([P_DEVICE]), SMS, p.tile_s,
                                      p.tile_h_half, 3.0e12)[0])


def test_a_large_gemm_runs_at_the_ceiling():
    """A large square GEMM fills every SM many times over: its FLOPs at the ceiling, plus each
    wave's fixed time."""
    p = bundled()
    t = _t(1, 8192, 8192, 8192)
    ideal = 2 * 8192 ** 3 / P_DEVICE
    waves = np.ceil((8192 // 128) * (8192 // 256) / SMS)
    assert ideal <= t <= (ideal + waves * p.tile_s) * 1.05


def test_wave_quantisation():
    """One more tile than there are SMs costs a second wave: a GEMM of S + 1 tiles takes
    markedly longer than one of S tiles, though it has 1/S more work."""
    p = bundled()
    full = _t(1, 128 * 12, 256 * 11, 4096, p)        # 12 x 11 = 132 tiles of 128 x 256
    over = _t(1, 128 * 12 + 1, 256 * 11, 4096, p)
    assert over > 1.2 * full


def test_split_k_for_skinny_gemms():
    """A weight gradient of a small layer (M, N small, K the tokens) fills few tiles: splitting
    K over thread blocks makes it faster than one wave of a few tiles would be."""
    p = bundled()
    t = _t(1, 256, 256, 1 << 20, p)
    one_wave = 2 * 128 * 256 * (1 << 20) / (P_DEVICE / SMS) + p.tile_s
    assert t < one_wave / 4
    assert t >= 2 * 256 * 256 * (1 << 20) / P_DEVICE


def _splits(b, m, n, k, p):
    """Seconds of each split-K count at its fastest tile, on the H100 above."""
    grid = kernels.gemm_grid(np.array([[b, m, n, k]], float), SMS)
    t = kernels.gemm_candidates(grid, np.array([P_DEVICE]), SMS, p.tile_s, p.tile_h_half, 3.0e12)
    return t[0].min(axis=0)


def test_split_k_is_not_capped_below_what_fills_the_device():
    """A ResNet stem's weight gradient at batch 512 (a 64 x 147 output reduced over 6.4M pixels)
    is a few tiles: only a split in the hundreds fills 132 SMs, and it runs at least twice as
    fast as at the best split of 16 or fewer; a GEMM whose tiles already fill the device many
    times over takes no split, its partial tiles' traffic costing more than they gain."""
    p = bundled()
    by_split = _splits(1, 64, 147, 6422528, p)
    assert kernels.SPLITS[int(np.argmin(by_split))] >= 64
    assert by_split.min() < 0.5 * by_split[kernels.SPLITS <= 16].min()
    assert by_split.min() == pytest.approx(_t(1, 64, 147, 6422528, p))
    assert kernels.SPLITS[int(np.argmin(_splits(1, 8192, 8192, 65536, p)))] == 1


def test_gemm_time_grows_with_every_dimension():
    base = _t(2, 1000, 1000, 1000)
    for dims in ((4, 1000, 1000, 1000), (2, 3000, 1000, 1000), (2, 1000, 3000, 1000),
                 (2, 1000, 1000, 3000)):
        assert _t(*dims) >= base


def test_attention_quantisation():
    assert kernels.attention_quantisation((1, 132, 132, 128, 128, 64, 64, 0, 0), 132,
                                          False) == 1.0
    assert kernels.attention_quantisation((1, 133, 133, 128, 128, 64, 64, 0, 0), 132,
                                          False) == pytest.approx(264 / 133)


def test_foreach_launches():
    assert kernels.foreach_launches((110, 1), 1e3) == 1
    assert kernels.foreach_launches((111, 1), 1e3) == 2
    assert kernels.foreach_launches((100, 3), 1e3) == 3          # 48 tensors a launch at depth 3
    assert kernels.foreach_launches((1, 1), 320 * 65536 + 1) == 2


def test_the_op_table_keeps_the_issue_order_of_a_cut_trace():
    """A trace read off a cut one repeats its last block's records; the op table puts their
    copies back after that block in each phase, so the queue sees blocks, then the head."""
    from trainplan.trace.derive import Traces
    from trainplan.predict.target import semantics_for
    job = validate(Job(model="hf:meta-llama/Llama-3.2-1B", batch_size=1, seq_len=64,
                       precision="bf16-amp"))
    sem = semantics_for(job, get_accelerator("h100-sxm"))
    tr = Traces().exact(job, sem, 1)
    table = summarize(tr)
    names = table.name[table.seq]
    phases = table.phase[table.seq]
    fwd = list(names[phases == 0])
    # the forward ends with the head and the loss, after every block's attention
    last_attn = max(i for i, n in enumerate(fwd) if "attention" in n)
    assert fwd.count("_scaled_dot_product_flash_attention") == 16
    assert any(n in ("mm", "_log_softmax") for n in fwd[last_attn:])
    assert len(table.seq) == int(table.count.sum())


def test_the_gemm_model_carries_over_to_a_gpu_it_was_not_read_off():
    """The tile-and-wave model of kernels.py against measured GEMMs (OpenXLA's table, 375 bf16
    shapes a GPU; scripts/gemm_table.py): with the fixed times `gemm_table.py --fit h100-sxm`
    reads off the H100's rows (a GEMM kernel's 4.48 us, a wave's 0.98 us, half efficiency at a
    tile size of 3.17; docs/validation.md), each of the B200's shapes, never fitted, within a
    few percent: the model's form holds on another generation, not only its scale."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "gemm_table.py"
    spec = importlib.util.spec_from_file_location("gemm_table", path)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    rows = g.load()
    for gpu, median_max, p90_max in (("h100-sxm", 0.05, 0.12), ("b200", 0.07, 0.15)):
        e = np.abs(g.errors(gpu, rows[gpu], 4.48e-6, 0.98e-6, 3.17))
        assert len(e) == 375
        assert np.median(e) < median_max and np.quantile(e, 0.9) < p90_max, gpu
