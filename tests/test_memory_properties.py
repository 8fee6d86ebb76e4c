"""Memory-model properties with closed forms, on the tiny reference transformer (fast).

ZeRO-3 shards model states 1/N; LoRA's optimizer state is the adapters' alone; checkpointing lowers
activations (and the recomputation does not pile up in backward); NF4 stores a weight in ~0.516
bytes, about a quarter of bf16; older PyTorch runtimes keep gradients, loop the optimizer and (up to
1.10) keep softmax inputs; the caching allocator gives cached segments back before running out of
memory.
"""
import math

import pytest

from conftest import tiny_job, trace
from trainplan.accelerators import get_accelerator
from trainplan.trace.derive.allocator import replay, replay_within
import trainplan.predict.sharding as sharding
from trainplan.predict.memory import (estimate_memory, framework_overhead_bytes,
                              largest_trainable_tensor_bytes, runtime, softmax_input_bytes)
from trainplan.spec import Lora

A100 = get_accelerator("a100-sxm4-80gb")
MiB = 2**20


def _linears(model_dims):
    """(out, in) of every linear of the tiny reference transformer but the (tied) lm_head."""
    h, f, n = model_dims.hidden_size, model_dims.ffn, model_dims.num_layers
    per_layer = [(h, h)] * 4 + [(f, h), (h, f)]          # q k v o, up, down (gelu MLP)
    return per_layer * n


@pytest.fixture(scope="module")
def fp32_trace():
    job = tiny_job(num_layers=4, batch_size=4, seq_len=64)
    return job, trace(job)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_zero3_model_states_fall_as_one_over_n(fp32_trace, n):
    """ZeRO-3 (Rajbhandari et al. 2020, P_os+g+p): weights, gradients and AdamW's two fp32
    moments are each split N ways: per device 4Psi/N + 4Psi/N + 8Psi/N (fp32: no master copy),
    plus DeepSpeed's contiguous gradient bucket (reduce_bucket_size elements, fp32 here)."""
    job, tr = fp32_trace
    one = estimate_memory(tr, A100, job).breakdown_bytes
    shard = estimate_memory(tr, A100, job.with_(strategy="zero3", gpus=n)).breakdown_bytes
    psi = tr.params_trainable
    assert tr.optimizer_state_bytes == pytest.approx(8 * psi, rel=0.01)    # 512-B rounding
    assert shard["weights"] == pytest.approx(one["weights"] / n, abs=1)
    assert shard["optimizer_states"] == pytest.approx(one["optimizer_states"] / n, abs=1)
    bucket = 4 * sharding._buckets(tr)[0]
    assert shard["gradients"] == pytest.approx(tr.gradient_bytes / n + bucket, rel=1e-3)
    states = lambda b: b["weights"] + b["optimizer_states"]  # noqa: E731
    assert states(shard) * n == pytest.approx(states(one), abs=n)


def test_lora_optimizer_state_is_the_adapters_alone():
    """LoRA r on q and v: trainable r (in + out) per adapted linear (Hu et al. 2021); AdamW keeps
    8 bytes per trainable fp32 parameter, so the state is that fraction of full fine-tuning."""
    r = 4
    full_job = tiny_job(num_layers=4)
    lora_job = full_job.with_(lora=Lora(rank=r, alpha=8, targets="q,v", dropout=0.0))
    full, lora = trace(full_job), trace(lora_job)
    d = full_job.transformer
    adapters = d.num_layers * 2 * r * (d.hidden_size + d.hidden_size)
    assert lora.params_trainable == adapters
    assert lora.optimizer_state_bytes == pytest.approx(8 * adapters, rel=0.05)
    assert lora.optimizer_state_bytes / full.optimizer_state_bytes < 0.1
    assert lora.optimizer_state_bytes / full.optimizer_state_bytes == pytest.approx(
        adapters / full.params_trainable, rel=0.05)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_lowers_activations(mode):
    base_job = tiny_job(num_layers=6, batch_size=8, seq_len=128)
    base, ck = trace(base_job), trace(base_job.with_(grad_checkpointing=mode))
    assert ck.activation_bytes < base.activation_bytes
    if mode == "full":   # only each block's input stays: one b x s x h tensor per layer
        d = base_job.transformer
        block_input = 8 * 128 * d.hidden_size * 4
        assert ck.activation_bytes < base.activation_bytes / 3
        assert ck.activation_bytes >= d.num_layers * block_input


def test_recomputed_blocks_do_not_pile_up_in_backward():
    """Backward reruns one checkpointed block at a time and frees it: its peak stays below the
    un-checkpointed backward's (the tracer once kept every rerun alive through module hooks)."""
    base_job = tiny_job(num_layers=6, batch_size=8, seq_len=128)
    base, ck = trace(base_job), trace(base_job.with_(grad_checkpointing="full"))
    assert ck.phase_peaks["backward"][0] < base.phase_peaks["backward"][0]
    acts_per_layer = base.activation_bytes / 6
    extra = ck.phase_peaks["backward"][1]["temporaries"]
    assert extra < 3 * acts_per_layer


def test_reentrant_checkpointing_drops_the_inputs_qlora_keeps():
    """bitsandbytes' MatMul4Bit before 0.43.2 keeps its input on ctx (not through
    save_for_backward; today's release keeps none: quantization.py), so under
    non-reentrant checkpointing every quantised layer's input that needs a gradient outlives the
    forward: per layer the normed input q, k and v share, the output projection's and the up
    projection's (b s h each) and the down projection's (b s f); in layer 0 the q/k/v input comes
    from the frozen embedding and needs no gradient, so bitsandbytes keeps none. Reentrant
    checkpointing runs the forward without autograd and keeps only the block input, as LoRA does;
    every adapter still gets its gradient (AdamW's 8 bytes per trainable parameter)."""
    from trainplan.trace.semantics import KernelSemantics
    from trainplan.trace.tracer import trace_step
    old = KernelSemantics(attention="efficient", bnb4_keeps_input=True)
    job = tiny_job(num_layers=4, batch_size=4, seq_len=64, grad_checkpointing="full",
                   lora=Lora(rank=4, alpha=8, targets="all-linear", dropout=0.0))
    lora = trace(job)
    nf4 = {impl: trace_step(job.with_(quantize="nf4", checkpoint_impl=impl), old)
           for impl in ("reentrant", "non-reentrant")}
    today = trace(job.with_(quantize="nf4", checkpoint_impl="non-reentrant"))
    assert today.activation_bytes == nf4["reentrant"].activation_bytes
    assert job.with_(quantize="nf4").reentrant_checkpointing  # auto: peft's QLoRA set-up
    assert nf4["reentrant"].activation_bytes == lora.activation_bytes
    d = job.transformer
    bsh, bsf = 4 * 64 * d.hidden_size * 4, 4 * 64 * d.ffn * 4     # fp32
    extra = nf4["non-reentrant"].activation_bytes - nf4["reentrant"].activation_bytes
    assert extra == d.num_layers * (3 * bsh + bsf) - bsh
    for t in nf4.values():
        assert t.optimizer_state_bytes == pytest.approx(8 * t.params_trainable, rel=0.01)


def test_nf4_weights_are_about_a_quarter_of_bf16():
    """QLoRA NF4 with double quantisation (Dettmers et al. 2023): 4 bits per weight, one 8-bit
    absmax per 64 weights, one fp32 scale per 256 absmax and one fp32 offset per weight:
    n/2 + n/64 + 4 n/16384 + 4 bytes."""
    job = tiny_job(num_layers=4, precision="bf16",
                   lora=Lora(rank=4, alpha=8, targets="q,v", dropout=0.0))
    bf16, nf4 = trace(job), trace(job.with_(quantize="nf4-dq"))
    lin = _linears(job.transformer)
    nf4_bytes = sum(math.ceil(o * i / 2) + math.ceil(o * i / 64)
                    + 4 * math.ceil(math.ceil(o * i / 64) / 256) + 4 for o, i in lin)
    bf16_bytes = sum(2 * o * i for o, i in lin)
    assert bf16.weight_bytes - nf4.weight_bytes == bf16_bytes - nf4_bytes
    assert 0.25 < nf4_bytes / bf16_bytes < 0.27


def test_adafactor_state_is_factored():
    """Adafactor keeps a row and a column vector per matrix and a full vector per 1-d parameter,
    all fp32 (Shazeer & Stern 2018)."""
    job = tiny_job(num_layers=2, optimizer="adafactor")
    tr = trace(job)
    from trainplan.models import build_model
    shapes = [p.shape for p in {id(p): p for p in build_model(job).module.parameters()}.values()]
    r512 = lambda b: -(-b // 512) * 512   # noqa: E731 -- the counter's allocation granularity
    want = sum(r512(4 * s[0]) + r512(4 * s[1]) if len(s) == 2 else r512(4 * s.numel())
               for s in shapes)
    assert tr.optimizer_state_bytes == want
    assert tr.optimizer_state_bytes < 0.05 * tr.weight_bytes


def test_torch1_runtime_keeps_gradients_and_loops_the_optimizer(fp32_trace):
    """zero_grad(set_to_none=False) before PyTorch 2.0 keeps every gradient through the forward;
    the per-parameter optimizer loop makes temporaries of one tensor at a time."""
    job, tr = fp32_trace
    old, new = runtime("torch1.12"), runtime("torch2")
    m_old, m_new = estimate_memory(tr, A100, job, old), estimate_memory(tr, A100, job, new)
    assert m_old.peak_allocated_bytes >= m_new.peak_allocated_bytes
    if m_old.peak_phase in ("forward", "backward"):
        assert m_old.breakdown_bytes["gradients"] == tr.gradient_bytes
    opt_tmp = tr.phase_peaks["optimizer"][1]["temporaries"]
    share = largest_trainable_tensor_bytes(tr) / tr.trainable_param_bytes
    d = job.transformer
    biggest = max(d.vocab_size, d.max_position_embeddings, d.ffn) * d.hidden_size
    assert largest_trainable_tensor_bytes(tr) == 4 * biggest   # the learned position table
    from trainplan.predict.memory import _transform
    loop = _transform(tr.phase_peaks["optimizer"][1], job, tr, "optimizer", old)
    assert loop["temporaries"] == int(opt_tmp * share)
    assert framework_overhead_bytes(A100, old) == 1343 * MiB       # V100 eager load, HF doc
    assert framework_overhead_bytes(A100, new) < framework_overhead_bytes(A100, old)


def test_allocator_releases_cached_segments_before_oom():
    """PyTorch's caching allocator frees cached, unused segments and retries a failed cudaMalloc
    (CUDACachingAllocator.cpp). A 30 MiB block freed, then two 40 MiB requests: unconstrained
    the 30 MiB segment stays cached (30 + 12 + 40 + 40 = 122 MiB reserved for 80 MiB allocated);
    under a 120 MiB limit the free segments are released and 82 MiB is the most ever reserved;
    under 60 MiB the step cannot run."""
    ev = [(1, 30 * MiB), (2, 12 * MiB), (1, -1), (3, 40 * MiB), (2, -1), (4, 40 * MiB)]
    assert replay(ev)[:2] == (80 * MiB, 122 * MiB)
    assert replay_within(ev, 120 * MiB) == (82 * MiB, False)
    assert replay_within(ev, 60 * MiB)[1] is True


def test_fit_uses_the_release_path_near_the_limit(fp32_trace):
    """A job whose unconstrained reserved peak exceeds the device but whose allocations fit after
    releasing cached segments is reported as fitting, with reserved <= free memory."""
    job, tr = fp32_trace
    rt = runtime("torch2")
    m = estimate_memory(tr, A100, job, rt)
    ctx = framework_overhead_bytes(A100, rt)
    frag = m.peak_reserved_bytes - m.peak_allocated_bytes
    if frag < 2 * MiB:
        pytest.skip("no fragmentation to give back in this trace")
    from dataclasses import replace
    tight = replace(A100, usable_memory_bytes=m.peak_allocated_bytes + ctx + frag // 2)
    mt = estimate_memory(tr, tight, job, rt)
    reserved, oom = replay_within(tr.log.events, tight.usable_memory_bytes - ctx)
    assert mt.fits is (not oom)
    if not oom:
        assert mt.peak_reserved_bytes <= tight.usable_memory_bytes - ctx


def test_capacity_below_allocations_never_fits(fp32_trace):
    job, tr = fp32_trace
    m = estimate_memory(tr, A100, job)
    from dataclasses import replace
    small = replace(A100, usable_memory_bytes=m.peak_allocated_bytes)  # no room for the context
    assert not estimate_memory(tr, small, job).fits


def test_torch110_keeps_every_softmax_input():
    """Up to PyTorch 1.10 softmax's backward referenced its input (pytorch/pytorch#64000), so
    eager attention kept the b x heads x s x s scores a second time per layer, and the loss's
    log_softmax its logits: b * heads * s^2 * 4 bytes per layer + b * (s - 1) * vocab * 4."""
    b, s, layers = 2, 32, 3
    job = tiny_job(num_layers=layers, batch_size=b, seq_len=s)
    tr = trace(job, attention="eager")
    d = job.transformer
    saved, rerun = softmax_input_bytes(tr)
    assert saved == layers * b * d.num_heads * s * s * 4 + b * (s - 1) * d.vocab_size * 4
    assert rerun == 0
    old, new = runtime("torch1.10"), runtime("torch1.12")
    fwd = tr.phase_peaks["forward"][1]
    from trainplan.predict.memory import _transform
    assert (_transform(fwd, job, tr, "forward", old)["activations"]
            - _transform(fwd, job, tr, "forward", new)["activations"]) == saved
    ck = trace(job.with_(grad_checkpointing="full"), attention="eager")
    saved_ck, rerun_ck = softmax_input_bytes(ck)
    assert saved_ck == b * (s - 1) * d.vocab_size * 4          # only the loss outside blocks
    assert rerun_ck == b * d.num_heads * s * s * 4             # one block rerun at a time
