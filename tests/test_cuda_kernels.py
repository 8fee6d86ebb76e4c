"""Kernels CUDA runs differently from the CPU build the tracer runs on (trace/emulation.py):
softmax's float16-to-float32 kernel and cross-entropy's composition under autocast
(KernelSemantics.cuda_softmax), the fused RMSNorm (KernelSemantics.fused_rms_norm,
trace/fused_norm.py); and the masked-LM batch an encoder is traced and measured with."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from trainplan.models import masked_lm_batch
from trainplan.models.reference import ReferenceTransformer, TransformerDims
from trainplan.trace.emulation import TargetSemantics
from trainplan.trace.fused_norm import fused_rms_norm, rms_norm, takes_fused
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

from conftest import AtenOps, tiny_job

B, S, H, LAYERS, VOCAB = 2, 32, 64, 2, 256


def _aten(fn, sem: KernelSemantics, shape, dtype, autocast=False):
    """The aten ops `fn` runs on a fake tensor of `shape` and `dtype` under `sem`."""
    with FakeTensorMode():
        x = torch.randn(*shape, dtype=dtype, requires_grad=True)
        ops = AtenOps()
        mode = TargetSemantics(sem)
        with mode, ops:
            mode.autocast_enabled = autocast
            fn(x)
    calls = [(name, args) for name, args, _ in ops.calls if name not in ("detach", "lift_fresh")]
    return [name for name, _ in calls], calls


@pytest.mark.parametrize("fn", [lambda x: F.softmax(x, -1, dtype=torch.float32),
                                lambda x: torch.log_softmax(x, -1, dtype=torch.float32),
                                lambda x: x.softmax(-1, dtype=torch.float32)])
def test_a_float16_softmax_asked_for_float32_reads_it_without_a_copy(fn):
    cuda, calls = _aten(fn, KernelSemantics(autocast_dtype="float16"), (4, 8), torch.float16)
    assert "_to_copy" not in cuda
    kernel = next(args for name, args in calls if name in ("_softmax", "_log_softmax"))
    assert kernel[2] is True                                   # half_to_float
    cpu, _ = _aten(fn, KernelSemantics(autocast_dtype="float16", cuda_softmax=False),
                   (4, 8), torch.float16)
    assert cpu.index("_to_copy") < next(i for i, n in enumerate(cpu) if "softmax" in n)


def test_autocast_asks_float32_of_a_softmax_but_copies_bfloat16():
    sem = KernelSemantics(autocast_dtype="float16")
    half, _ = _aten(lambda x: F.log_softmax(x, -1), sem, (4, 8), torch.float16, autocast=True)
    assert half == ["_log_softmax"]
    bf16, _ = _aten(lambda x: F.log_softmax(x, -1), sem, (4, 8), torch.bfloat16, autocast=True)
    assert bf16 == ["_to_copy", "_log_softmax"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cross_entropy_under_autocast_is_composed_as_aten_composes_it(dtype):
    """log_softmax in the logits' own dtype, then a float32 copy for nll_loss (CUDA autocast
    has no cross_entropy_loss; LossNLL.cpp passes log_softmax the input's dtype)."""
    def ce(x):
        return F.cross_entropy(x, torch.tensor([1, 2, 3, -100]))
    sem = KernelSemantics(autocast_dtype=str(dtype).split(".")[-1])
    names, calls = _aten(ce, sem, (4, 8), dtype, autocast=True)
    assert names[:3] == ["_log_softmax", "_to_copy", "nll_loss_forward"]
    assert calls[0][1][2] is False                        # no half_to_float: its own dtype
    cpu, _ = _aten(ce, KernelSemantics(autocast_dtype=sem.autocast_dtype, cuda_softmax=False),
                   (4, 8), dtype, autocast=True)
    assert cpu[:3] == ["_to_copy", "_log_softmax", "nll_loss_forward"]


def test_the_fused_rms_norm_computes_what_pytorch_does():
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
        for w in (torch.randn(16, dtype=dtype, requires_grad=True), None):
            ours = rms_norm(x, (16,), w, 1e-6)
            theirs = F.rms_norm(x, (16,), w, 1e-6)
            assert ours.dtype == dtype and torch.allclose(ours, theirs, atol=tol, rtol=tol)
            g = torch.randn_like(ours)
            got = torch.autograd.grad(ours, [x] + ([w] if w is not None else []), g)
            want = torch.autograd.grad(theirs, [x] + ([w] if w is not None else []), g)
            for a, b in zip(got, want):
                assert torch.allclose(a, b, atol=tol * 10, rtol=tol * 10)
    out, rstd = fused_rms_norm(torch.randn(2, 3, 8, dtype=torch.bfloat16), [8], None, None)
    assert rstd.shape == (2, 3, 1) and rstd.dtype == torch.float32


def test_the_fused_kernel_is_not_taken_where_cuda_falls_back():
    x = torch.randn(2, 4, 3, 3)
    assert takes_fused(x, torch.ones(3))
    assert not takes_fused(x, torch.ones(3, dtype=torch.bfloat16))     # dtypes differ
    assert not takes_fused(x.contiguous(memory_format=torch.channels_last), None)
    assert not takes_fused(torch.randn(2, 3, dtype=torch.complex64), None)


def _trace(sem: KernelSemantics, **kw):
    job = tiny_job(norm="rmsnorm", kind="encoder", num_layers=LAYERS, hidden_size=H,
                   vocab_size=VOCAB, batch_size=B, seq_len=S, dropout=0.0, **kw)
    return trace_step(job, sem)


def test_an_rms_norm_is_one_kernel_each_way_keeping_the_input_and_its_rstd():
    fused = _trace(KernelSemantics())
    composite = _trace(KernelSemantics(fused_rms_norm=False))
    norms = 2 * LAYERS + 1
    names = [r.name for r in fused.ops]
    assert names.count("fused_rms_norm") == norms
    assert names.count("fused_rms_norm_backward") == norms
    assert "rsqrt" not in names and "rsqrt" in [r.name for r in composite.ops]
    # what the composite's nodes keep beyond the fused one's: each norm's normalised input, fp32
    kept = composite.activation_bytes - fused.activation_bytes
    assert kept == norms * B * S * H * 4


def test_an_fp16_amp_encoder_holds_no_fp32_copy_of_its_logits_before_log_softmax():
    cuda = _trace(KernelSemantics(autocast_dtype="float16"), precision="fp16-amp")
    cpu = _trace(KernelSemantics(autocast_dtype="float16", cuda_softmax=False),
                 precision="fp16-amp")
    logits = B * S * VOCAB
    fwd = [r for r in cuda.ops if r.phase == "forward"]
    i = next(k for k, r in enumerate(fwd) if r.name == "_log_softmax")
    assert fwd[i].dtype == "float16" and fwd[i].bytes == logits * 2 * 2
    assert fwd[i + 1].name == "_to_copy" and fwd[i + 1].bytes == logits * (2 + 4)
    # the CPU order writes an fp32 copy, then an fp32 log_softmax: the forward's peak at the
    # loss holds fp32 + fp32 where CUDA's holds fp16 + fp32
    assert cpu.phase_peaks["forward"][0] - cuda.phase_peaks["forward"][0] == logits * 2


def test_a_masked_lm_batch_predicts_a_sixth_of_its_positions():
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (8, 512))
    b = masked_lm_batch(ids, 999)
    chosen = b["labels"] != -100
    assert chosen[:, -1].all() and 0.12 < chosen.float().mean() < 0.18
    assert torch.equal(b["labels"][chosen], ids[chosen])
    assert (b["input_ids"][chosen] == 999).all()
    assert torch.equal(b["input_ids"][~chosen], ids[~chosen])


def test_the_reference_encoder_has_something_to_learn():
    """Given its own tokens as labels, a tied-embedding encoder predicted them exactly: loss 0
    and every gradient 0 (GraphMER-SE on the H200). Masked, it starts near ln(vocab)."""
    torch.manual_seed(0)
    d = TransformerDims(hidden_size=H, num_layers=LAYERS, num_heads=4, intermediate_size=128,
                        vocab_size=VOCAB, kind="encoder", norm="rmsnorm",
                        positional_encoding="alibi")
    model = ReferenceTransformer(d)
    loss = model(**masked_lm_batch(torch.randint(0, VOCAB, (B, S)), VOCAB - 1))
    loss.backward()
    assert abs(loss.item() - math.log(VOCAB)) < 1.0
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in model.parameters())


def test_measure_predicts_the_rms_norm_its_own_pytorch_runs(monkeypatch):
    """`measure` compares with the kernels of the PyTorch it runs: a CUDA build before 2.9 has no
    fused RMSNorm, whatever the catalog's semantics assume of today's releases."""
    from trainplan.measure import runner
    job = tiny_job(norm="rmsnorm")
    cuda = torch.device("cuda")
    for has_kernel in (True, False):
        monkeypatch.setattr(runner, "_fused_rms_norm_release", lambda h=has_kernel: h)
        assert runner.local_semantics(job, cuda, "h200").fused_rms_norm is has_kernel
    cpu = runner.local_semantics(job, torch.device("cpu"), None)
    assert not cpu.fused_rms_norm and not cpu.cuda_softmax
