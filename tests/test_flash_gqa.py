"""Grouped-query attention on flash keeps its K/V heads (trace/flash_gqa.py): PyTorch's CUDA
SDPA hands them to FlashAttention-2 as they are, and only the other kernels see them expanded."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from trainplan.trace.emulation import TargetSemantics
from trainplan.trace.flash_gqa import gqa_flash
from trainplan.trace.semantics import KernelSemantics

from conftest import AtenOps

B, HQ, HKV, S, D = 2, 8, 2, 64, 32


def _shapes(ops: AtenOps) -> list[tuple[str, list[tuple]]]:
    """Each aten op a call ran, with the shapes of its tensor results."""
    def res(out):
        return out if isinstance(out, (tuple, list)) else (out,)
    return [(name, [tuple(t.shape) for t in res(out) if isinstance(t, torch.Tensor)])
            for name, _, out in ops.calls]


def _qkv(dtype=torch.bfloat16):
    return (torch.randn(B, HQ, S, D, dtype=dtype, requires_grad=True),
            torch.randn(B, HKV, S, D, dtype=dtype, requires_grad=True),
            torch.randn(B, HKV, S, D, dtype=dtype, requires_grad=True))


def _run(attention: str, dtype=torch.bfloat16, **kernels):
    """(forward ops, backward ops, shapes autograd saved) of one grouped-query SDPA call."""
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t
    with FakeTensorMode():
        q, k, v = _qkv(dtype)
        fwd, bwd = AtenOps(), AtenOps()
        with TargetSemantics(KernelSemantics(attention=attention, **kernels)), fwd, \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        with bwd:
            out.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape == v.grad.shape
    return _shapes(fwd), _shapes(bwd), saved


def test_flash_reads_the_grouped_heads_and_keeps_them_for_backward():
    fwd, _bwd, saved = _run("flash")
    flash = [shapes for name, shapes in fwd if name == "_scaled_dot_product_flash_attention"]
    assert len(flash) == 1 and flash[0][0] == (B, HQ, S, D)
    assert not any(name == "clone" for name, _ in fwd)          # no repeat_interleave
    assert (B, HKV, S, D) in saved and (B, HQ, S, D) in saved   # K/V as they are, q, out
    assert saved.count((B, HQ, S, D)) == 2                      # q and the output, no K/V copy


def test_flash_backward_writes_every_query_heads_gradient_and_sums_each_group():
    _fwd, bwd, _saved = _run("flash")
    names = [name for name, _ in bwd]
    i = names.index("_scaled_dot_product_flash_attention_backward")
    after = bwd[i + 1:]
    # mha_bwd's dk_expanded and dv_expanded, each summed over its group of HQ / HKV heads
    assert [s for n, s in after if n == "new_empty"] == [[(B, HQ, S, D)]] * 2
    assert [s for n, s in after if n == "sum"] == [[(B, HKV, S, D)]] * 2


@pytest.mark.parametrize("attention,dtype", [("flash", torch.float32),    # flash refuses fp32
                                             ("math", torch.bfloat16)])
def test_every_other_kernel_sees_the_heads_expanded(attention, dtype):
    fwd, _bwd, saved = _run(attention, dtype)
    assert not any(name == "_scaled_dot_product_flash_attention" for name, _ in fwd)
    assert [s for n, s in fwd if n == "clone"][:2] == [[(B, HKV, HQ // HKV, S, D)]] * 2


@pytest.mark.parametrize("dtype,kernel", [(torch.bfloat16, "_scaled_dot_product_flash_attention"),
                                          (torch.float32,
                                           "_scaled_dot_product_efficient_attention")])
def test_a_model_that_copies_its_kv_heads_gives_sdpa_no_grouping(dtype, kernel):
    """transformers before 4.54 (repeat_kv), torchtitan, torchtune: SDPA sees HQ K/V heads, so
    even an fp32 call takes the memory-efficient kernel, where grouped heads fell to math."""
    fwd, _bwd, saved = _run("flash", dtype, expands_kv=True)
    assert [s for n, s in fwd if n == "clone"][:2] == [[(B, HKV, HQ // HKV, S, D)]] * 2
    assert [s[0] for n, s in fwd if n == kernel] == [(B, HQ, S, D)]
    assert (B, HKV, S, D) not in saved


def test_gqa_flash_with_dropout_returns_the_kernels_shapes():
    """The Function's result and gradients have the shapes the kernel's have."""
    with FakeTensorMode():
        q, k, v = _qkv()
        out = gqa_flash(q, k, v, 0.1, True, None)
        out.sum().backward()
        assert out.shape == q.shape
        assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)


def test_a_traced_step_keeps_the_grouped_heads_not_their_copies():
    """A grouped-query decoder's saved activations: the copies transformers before 4.54 made
    (and kept for the kernel's backward) are 2 x (HQ - HKV) x head_dim x tokens x 2 bytes a
    layer more than today's grouped call keeps."""
    from trainplan.spec import Job, validate
    from trainplan.trace.tracer import trace_step

    from conftest import shallow
    layers, batch, seq = 2, 1, 128
    job = validate(Job(model=shallow("meta-llama/Llama-3.2-1B", layers), batch_size=batch,
                       seq_len=seq, precision="bf16-amp"))
    sem = KernelSemantics(attention="flash", autocast_dtype="bfloat16")
    grouped = trace_step(job, sem, 1)
    copied = trace_step(job, KernelSemantics(attention="flash", autocast_dtype="bfloat16",
                                             expands_kv=True), 1)
    hq, hkv, d = 32, 8, 64                          # Llama-3.2-1B's heads and head dim
    extra = layers * 2 * (hq - hkv) * d * batch * seq * 2
    assert copied.activation_bytes - grouped.activation_bytes == extra
    assert grouped.flash_eligible == copied.flash_eligible == layers
