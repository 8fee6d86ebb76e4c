"""CUDA's layout rules in the tracer (trace/cuda_layout.py): group norm computes NCHW on a GPU,
and a convolution converts an activation that is not in the layout cuDNN runs."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from trainplan.spec import Job, validate
from trainplan.trace import cuda_layout
from trainplan.trace.emulation import TargetSemantics
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

from conftest import AtenOps

CL = torch.channels_last
aten = torch.ops.aten


def test_the_cuda_group_norm_computes_what_pytorch_does_and_writes_nchw():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=CL).requires_grad_()
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    r = torch.randn(2, 8, 5, 5)
    y = cuda_layout.group_norm(x, 4, w, b, 1e-5)
    ref = F.group_norm(x, 4, w, b, 1e-5)
    assert y.is_contiguous() and ref.is_contiguous(memory_format=CL)    # the CPU keeps CL
    torch.testing.assert_close(y, ref)
    got = torch.autograd.grad((y * r).sum(), (x, w, b))
    want = torch.autograd.grad((ref * r).sum(), (x, w, b))
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    assert got[0].is_contiguous()                                  # dX as CUDA writes it


def test_a_group_norm_without_affine_parameters_runs_too():
    x = torch.randn(2, 8, 3, 3).contiguous(memory_format=CL).requires_grad_()
    y = cuda_layout.group_norm(x, 2)
    torch.testing.assert_close(y, F.group_norm(x, 2))
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    (ex,) = torch.autograd.grad(F.group_norm(x, 2).square().sum(), x)
    torch.testing.assert_close(gx, ex)


def _group_norm_ops(sem: KernelSemantics, memory_format) -> list[str]:
    with FakeTensorMode():
        x = torch.randn(4, 16, 8, 8).contiguous(memory_format=memory_format).requires_grad_()
        ops = AtenOps()
        with TargetSemantics(sem), ops:
            F.group_norm(x, 4).sum().backward()
    return ops.names


def test_a_channels_last_group_norm_copies_its_input_on_a_gpu_only():
    gpu = _group_norm_ops(KernelSemantics(channels_last=True), CL)
    cpu = _group_norm_ops(KernelSemantics(channels_last=True, cuda_layouts=False), CL)
    # forward: the input made contiguous; backward: the incoming gradient (a sum's arrives
    # expanded, stride 0: copied on either device) and the saved input
    assert gpu.count("clone") == 3 and cpu.count("clone") == 1
    assert gpu.index("clone") < gpu.index("native_group_norm")
    # an NCHW input is taken as it is: only the expanded gradient is copied
    assert _group_norm_ops(KernelSemantics(), torch.contiguous_format).count("clone") == 1


def _conv_args(x_fmt, w_fmt, dtype=torch.float16):
    x = torch.empty(2, 8, 6, 6, dtype=dtype).contiguous(memory_format=x_fmt)
    w = torch.empty(16, 8, 3, 3, dtype=dtype).contiguous(memory_format=w_fmt)
    return x, w


def _converted(packet, args) -> int:
    """The bytes `cuda_layout.convolution` says the op's own conversions move."""
    out = (None, None, None) if packet is aten.convolution_backward else None
    return cuda_layout.convolution(packet, args, out)[1]


def test_a_convolution_converts_an_operand_not_in_the_layout_cudnn_runs():
    nchw = torch.contiguous_format
    x, w = _conv_args(nchw, CL)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert _converted(aten.convolution, args) == 2 * x.numel() * 2
    for fx, fw in ((CL, CL), (nchw, nchw), (CL, nchw)):
        x2, w2 = _conv_args(fx, fw)
        assert _converted(aten.convolution, (x2, w2) + args[2:]) == 0
    # an NCHW slice (a channel split) is not contiguous: cuDNN gets a contiguous copy
    part = torch.empty(2, 16, 6, 6, dtype=torch.float16)[:, :8]
    w3 = torch.empty(16, 8, 3, 3, dtype=torch.float16)
    assert _converted(aten.convolution, (part, w3) + args[2:]) == \
        2 * part.numel() * 2
    # backward: the incoming gradient and the saved input, each where it is not channels-last
    g = torch.empty(2, 16, 6, 6, dtype=torch.float16)
    back = (g, x, w, [16], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    assert _converted(aten.convolution_backward, back) == \
        2 * (g.numel() + x.numel()) * 2
    assert _converted(aten.add, (x, x)) == 0


def test_a_convolution_writes_the_layout_it_runs():
    x, w = _conv_args(torch.contiguous_format, CL, torch.float32)
    out = torch.empty(2, 16, 4, 4)                   # as the fake CPU device writes it
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    assert cuda_layout.convolution(aten.convolution, args, out)[0].is_contiguous(memory_format=CL)
    grads = (torch.empty_like(x), torch.empty_like(w, memory_format=torch.contiguous_format),
             None)
    back = (torch.empty_like(out),) + args[:2] + ([16],) + args[3:] + ([True, True, False],)
    dx, dw, db = cuda_layout.convolution(aten.convolution_backward, back, grads)[0]
    assert dx.is_contiguous(memory_format=CL) and dw.is_contiguous(memory_format=CL)
    assert db is None


CONVNET = textwrap.dedent("""
    import torch
    from torch import nn

    def build(norm="group"):
        def norm_layer(c):
            return nn.GroupNorm(4, c) if norm == "group" else nn.BatchNorm2d(c)
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), norm_layer(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), norm_layer(32), nn.ReLU(),
            nn.Conv2d(32, 32, 1), norm_layer(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
""")


@pytest.fixture(scope="module")
def convnet(tmp_path_factory):
    path = tmp_path_factory.mktemp("convnet") / "net.py"
    path.write_text(CONVNET)

    def job(norm: str) -> Job:
        return validate(Job(model=f"py:{path}:build", model_args={"norm": norm},
                            inputs=[{"name": "input", "shape": ["batch", 3, 16, 16],
                                     "dtype": "float32"}],
                            batch_size=4, precision="fp16-amp", channels_last=True))
    return job


def _trace(job, cuda: bool):
    return trace_step(job, KernelSemantics(autocast_dtype="float16", channels_last=True,
                                           cuda_layouts=cuda))


def test_a_channels_last_group_norm_convnet_pays_cudas_transposes(convnet):
    job = convnet("group")
    gpu, cpu = _trace(job, True), _trace(job, False)
    names = [r.name for r in gpu.ops]
    # every group norm copies its input (the input batch's own copy is in both)
    assert names.count("clone") - [r.name for r in cpu.ops].count("clone") >= 3
    moved = sum(r.bytes for r in gpu.ops) - sum(r.bytes for r in cpu.ops)
    assert moved > 0.2 * sum(r.bytes for r in cpu.ops)
    # the convolution after a group norm reads its NCHW activation and converts it
    conv_bytes = [sum(r.bytes for r in t.ops if r.name == "convolution") for t in (gpu, cpu)]
    assert conv_bytes[0] > conv_bytes[1]
    # the copies are temporaries: the nodes keep what CUDA's keep
    assert gpu.activation_bytes == cpu.activation_bytes


def test_a_batch_norm_convnet_runs_the_same_kernels_on_either_device(convnet):
    job = convnet("batch")
    gpu, cpu = _trace(job, True), _trace(job, False)
    assert [(r.name, r.bytes) for r in gpu.ops] == [(r.name, r.bytes) for r in cpu.ops]


def test_a_channels_last_models_weights_are_made_channels_last():
    from trainplan.trace.counters import StepCounter
    from trainplan.trace.prepare import _materialise
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1))
    model.to(memory_format=CL)
    with FakeTensorMode(), StepCounter() as counter:
        _materialise(model, counter)
        w3, w1 = model[0].weight, model[1].weight
        assert w3.device.type == "cpu" and w3.is_contiguous(memory_format=CL)
        assert not w3.is_contiguous()
        assert w1.stride() == (8, 1, 8, 8)           # a 1 x 1 kernel's, as .to() left it
