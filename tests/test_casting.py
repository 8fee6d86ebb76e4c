"""trace/casting.py: which ops CUDA runs through TensorIterator's dynamic-casting loop, and what the
time model does with them (predict/timing.py `cast_bw`)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainplan.trace.casting import dynamic_casting

aten = torch.ops.aten


def _meta(dtype, *shape):
    return torch.empty(*(shape or (4, 8)), dtype=dtype, device="meta")


def _casts(op, *args):
    out = op(*args)
    ins = [a for a in args if isinstance(a, torch.Tensor)]
    return dynamic_casting(op, op._overloadpacket, args, ins, [out])


def test_an_elementwise_op_over_mixed_floats_casts_and_one_dtype_does_not():
    bf, f32, f16 = (_meta(d) for d in (torch.bfloat16, torch.float32, torch.float16))
    assert _casts(aten.add.Tensor, bf, f32)           # a half residual + an fp32 LayerNorm output
    assert _casts(aten.mul.Tensor, f32, f16)          # an fp32 weight x a half activation
    assert not _casts(aten.add.Tensor, bf, bf)
    assert not _casts(aten.tanh.default, f32)
    # a Python number wrapped as a 0-dim tensor is passed by value, not loaded
    assert not _casts(aten.mul.Tensor, bf, torch.tensor(0.5, device="meta"))
    # a boolean mask is not a floating operand
    assert not _casts(aten.where.self, _meta(torch.bool), bf, bf)


def test_only_the_upcast_copy_casts():
    """Copy.cu: float -> half and float -> bfloat16 have their own vector kernels on CUDA; half or
    bfloat16 -> float goes through the casting loop."""
    def to(x, dtype):
        out = aten._to_copy.default(x, dtype=dtype)
        return dynamic_casting(aten._to_copy.default, aten._to_copy, (x,), [x], [out])
    assert to(_meta(torch.bfloat16), torch.float32)
    assert to(_meta(torch.float16), torch.float32)
    assert not to(_meta(torch.float32), torch.bfloat16)
    assert not to(_meta(torch.float32), torch.float16)
    dst, src = _meta(torch.float32), _meta(torch.bfloat16)
    assert dynamic_casting(aten.copy_.default, aten.copy_, (dst, src), [dst, src], [dst])


def test_reductions_and_norms_keep_their_own_kernels():
    bf = _meta(torch.bfloat16)
    assert not _casts(aten.sum.dim_IntList, bf, [1])
    w = _meta(torch.float32, 8)
    out = aten.native_layer_norm.default(bf, [8], w, w, 1e-5)[0]
    assert not dynamic_casting(aten.native_layer_norm.default, aten.native_layer_norm,
                               (bf, [8], w, w, 1e-5), [bf, w, w], [out])


def test_a_traced_autocast_step_marks_its_casting_ops_and_the_time_model_prices_them():
    """GPT-2's tanh GELU under bf16 autocast: `pow` runs in fp32, so the adds and multiplies that
    mix it with the bf16 input cast; priced at `cast_bw` of the bandwidth, they take 1/cast_bw
    the time they took, and no other op moves."""
    from dataclasses import replace

    from trainplan.accelerators import get_accelerator
    from trainplan.predict.optable import summarize
    from trainplan.predict.time_params import bundled
    from trainplan.predict.timing import op_times
    from trainplan.spec import Job, validate
    from trainplan.trace.semantics import KernelSemantics
    from trainplan.trace.tracer import trace_step

    job = validate(Job(model="hf:openai-community/gpt2", batch_size=2, seq_len=64,
                       precision="bf16-amp", gpu="h100-sxm"))
    tr = trace_step(job, KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16))
    table = summarize(tr)
    cast = table.cast
    assert cast.any() and not cast.all()
    assert set(table.name[cast]) <= {"add", "mul", "_to_copy", "copy_", "tanh_backward",
                                     "pow", "sub", "div", "where", "add_", "mul_"}
    assert not np.any(table.family[cast] != 2)        # never a GEMM or attention
    accel = get_accelerator("h100-sxm")
    p = replace(bundled(), cast_bw=1.0, kernel_s=0.0)
    slow = replace(p, cast_bw=0.5)
    t1, _ = op_times(table, accel, job.precision, p)
    t2, _ = op_times(table, accel, job.precision, slow)
    memory_bound = cast & (table.flops == 0)
    assert t2[memory_bound] == pytest.approx(2 * t1[memory_bound])
    assert np.array_equal(t1[~cast], t2[~cast])
    # the loop is CUDA's: XLA fuses elementwise ops, ROCm runs its own loops
    for other in ("tpu-v5e-1", "mi300x"):
        accel = get_accelerator(other)
        assert accel.backend != "cuda"
        assert np.array_equal(op_times(table, accel, job.precision, p)[0],
                              op_times(table, accel, job.precision, slow)[0])
