"""Quantised base weights (quantization.py, models/lora.py): each library's bytes in closed form,
what its matmul keeps for backward, and the spellings users write."""
from __future__ import annotations

import math

import pytest

from trainplan.errors import TrainplanError
from trainplan.models.lora import QuantizedWeight
from trainplan.quantization import FP4, INT8, NF4, NF4_DQ, NONE, TORCHAO_NF4, parse
from trainplan.spec import Lora

from conftest import AtenOps, tiny_job, trace

SHAPES = [(4096, 4096), (11008, 4096), (64, 128), (3, 5)]


@pytest.mark.parametrize("out_f,in_f", SHAPES)
def test_nf4_bytes_closed_form(out_f, in_f):
    n = out_f * in_f
    blocks = math.ceil(n / 64)
    # bitsandbytes default: one fp32 absmax per 64 weights
    assert NF4.weight_bytes(out_f, in_f) == math.ceil(n / 2) + 4 * blocks
    assert FP4.weight_bytes(out_f, in_f) == NF4.weight_bytes(out_f, in_f)
    # double quantisation: 8-bit absmax, one fp32 scale per 256 of them, one fp32 offset
    dq = math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / 256) + 4
    assert NF4_DQ.weight_bytes(out_f, in_f) == dq
    assert TORCHAO_NF4.weight_bytes(out_f, in_f) == dq
    # LLM.int8: one byte a weight, one fp32 scale per output row
    assert INT8.weight_bytes(out_f, in_f) == n + 4 * out_f


def test_qlora_paper_bits_per_parameter():
    """QLoRA section 3: 32/64 = 0.5 bits of statistics per parameter without double quantisation,
    8/64 + 32/(64*256) = 0.127 with it (large matrices: the offset is negligible)."""
    n = 4096 * 4096
    assert (NF4.weight_bytes(4096, 4096) * 8 / n - 4) == pytest.approx(0.5)
    assert (NF4_DQ.weight_bytes(4096, 4096) * 8 / n - 4) == pytest.approx(0.127, abs=1e-3)


@pytest.mark.parametrize("q", [NF4, NF4_DQ, INT8, TORCHAO_NF4])
def test_layer_holds_exactly_the_closed_form(q):
    import torch
    with torch.device("meta"):
        w = QuantizedWeight(11008, 4096, q, torch.bfloat16)
    held = w.packed.numel() + w.quant_state.numel()
    assert held == q.weight_bytes(11008, 4096)


def _qlora(quantize, targets="all-linear", **kw):
    return tiny_job(lora=Lora(rank=4, alpha=8, targets=targets, dropout=0.0),
                    quantize=quantize, precision="bf16", **kw)


# the tiny reference decoder's linears, each layer (the head, lm_head, is never quantised)
LAYER_LINEARS = [(64, 64)] * 4 + [(128, 64), (64, 128)]
FWD, BWD = "forward", "backward"


def test_traced_weights_are_the_quantised_layers_plus_the_rest():
    """Traced weight bytes change by exactly the closed form of every quantised linear: the
    frozen bf16 weight (2 B each) leaves, the packed weight with its state comes in. LoRA
    adapters on every linear are the same in all three jobs."""
    plain = trace(_qlora("none"))
    linears = LAYER_LINEARS * 2
    for q in (NF4, NF4_DQ, INT8):
        tr = trace(_qlora(q.name))
        delta = sum(q.weight_bytes(o, i) - 2 * o * i for o, i in linears)
        assert tr.weight_bytes - plain.weight_bytes == delta
        assert tr.params_total == plain.params_total      # quantised weights count what they encode
        assert any("quantisation state" in n for n in tr.notes)


def test_each_dequantisation_is_a_kernel_moving_the_codes_and_the_weight():
    """bitsandbytes dequantises a layer's weight before its forward matmul and again in backward
    for the input's gradient (MatMul4Bit): one kernel each time, reading the codes and their
    state and writing the weight in the compute dtype. Under full checkpointing the backward's
    rerun dequantises once more. The trace holds one `dequantize` op a use, with exactly those
    bytes, and the step time pays for them (they were a `torch.empty`, which launches no kernel
    and cost nothing)."""
    from collections import Counter

    from trainplan.accelerators import get_accelerator
    from trainplan.predict.timing import estimate_step_time
    linears = LAYER_LINEARS * 2
    per_use = {NF4.weight_bytes(o, i) + 2 * o * i for o, i in linears}
    t4 = get_accelerator("t4")
    # without checkpointing the first block's q, k and v read the frozen embedding's output: no
    # input gradient, no backward dequantisation; peft's reentrant checkpointing makes that
    # input require a gradient (enable_input_require_grads), so there every layer has one
    for ckpt, want in (("none", {(FWD, False): 12, (BWD, False): 9}),
                       ("full", {(FWD, False): 12, (BWD, True): 12, (BWD, False): 12})):
        job = _qlora("nf4", grad_checkpointing=ckpt)
        ops = [r for r in trace(job).ops if r.name == "dequantize"]
        assert Counter((r.phase, r.recompute) for r in ops) == want
        assert {r.bytes for r in ops} == per_use
        assert all(r.flops == 0 and r.family == "other" for r in ops)
    # the same model with its linears bf16 and frozen: the quantised one is the slower step
    qlora, lora = _qlora("nf4"), _qlora("none")
    assert estimate_step_time(trace(qlora), t4, qlora).step_time_s > \
        estimate_step_time(trace(lora), t4, lora).step_time_s


def test_double_quantisation_rebuilds_the_scales_first():
    """With double quantisation bitsandbytes first dequantises the 8-bit block scales to fp32
    (`dequantize_blockwise`) and adds their offset, then runs the weight's kernel, which reads
    those fp32 scales: three kernels a use, bytes in closed form (state in, fp32 scales out;
    the scales read and written, and the offset read; codes and fp32 scales in, weight out)."""
    import math
    job = _qlora("nf4-dq", grad_checkpointing="none")
    ops = [r for r in trace(job).ops if r.phase == FWD and r.module.endswith(".base")
           and r.name in ("dequantize", "add_")]
    assert [r.name for r in ops[:3]] == ["dequantize", "add_", "dequantize"]
    expect = 0
    for o, i in LAYER_LINEARS * 2:
        n, blocks = o * i, math.ceil(o * i / 64)
        state = NF4_DQ.weight_bytes(o, i) - math.ceil(n / 2)
        expect += (state + 4 * blocks) + (8 * blocks + 4) + (math.ceil(n / 2) + 4 * blocks + 2 * n)
    assert sum(r.bytes for r in ops) == expect


@pytest.mark.parametrize("q,shape,in_f,fused", [
    (NF4_DQ, (1, 1, 128), 128, True),     # one row, no autograd: bitsandbytes' fused GEMV
    (NF4, (1, 128), 128, True),
    (NF4_DQ, (2, 1, 128), 128, False),    # two sequences: dequantise, then the matmul
    (NF4_DQ, (1, 1, 96), 96, False),      # hidden size not a multiple of the block: the slow path
    (TORCHAO_NF4, (1, 1, 128), 128, False),   # torchao's linear_nf4 always dequantises
])
def test_one_row_without_autograd_takes_the_fused_gemv(q, shape, in_f, fused):
    """bitsandbytes' `matmul_4bit` (0.43-0.49): a single row with no gradient wanted (a batch-1
    decode step) and a hidden size that is a multiple of 64 runs `gemv_4bit`, reading the codes
    and never writing a full-size weight; anything else dequantises first (MatMul4Bit)."""
    import torch
    import torch.nn as nn

    from trainplan.models.lora import QuantLinear

    with torch.device("meta"):
        layer = QuantLinear(nn.Linear(in_f, 32, bias=False), q, torch.bfloat16)
        x = torch.empty(shape, dtype=torch.bfloat16)
    with torch.no_grad(), AtenOps() as ops:
        y = layer(x)
    assert y.shape == (*shape[:-1], 32)
    assert ("gemv_4bit" in ops.names) == fused
    # a full-size weight is written only where the GEMV is not taken (with double quantisation
    # both paths first rebuild the fp32 block scales, a small `dequantize` of their own)
    written = [tuple(out.shape) for name, _, out in ops.calls if name == "dequantize"]
    assert (layer.weight_q.shape in written) == (not fused)


def test_only_old_bitsandbytes_keeps_each_input():
    """bitsandbytes' MatMul4Bit kept each quantised layer's input for backward up to 0.43.1
    (`ctx.tensors = (A, B)`); 0.43.2 (#1270) keeps only the weight, as torchao's linear_nf4 does:
    same weights, and with adapters on q and v only the inputs of o, up and down are kept by the
    old release alone. LLM.int8 keeps its input in every release."""
    from trainplan.trace.semantics import KernelSemantics
    from trainplan.trace.tracer import trace_step
    job = _qlora("nf4-dq", "q,v")
    bnb, ao = trace(job), trace(_qlora("torchao-nf4", "q,v"))
    old = trace_step(job, KernelSemantics(attention="efficient", bnb4_keeps_input=True))
    assert bnb.weight_bytes == ao.weight_bytes == old.weight_bytes
    assert bnb.activation_bytes == ao.activation_bytes < old.activation_bytes
    assert INT8.keeps_input_in(False) and NF4.keeps_input_in(True) and not NF4.keeps_input_in()


@pytest.mark.parametrize("text,q", [("bnb.nf4", NF4), ("bnb.nf4-dq", NF4_DQ), ("QLoRA", NF4_DQ),
                                    ("8bit", INT8), ("none", NONE), (None, NONE),
                                    ("torchtune-nf4", TORCHAO_NF4)])
def test_spellings(text, q):
    assert parse(text) is q


def test_bad_spelling_names_the_close_match():
    with pytest.raises(TrainplanError) as e:
        parse("nf4-qd")
    assert "Did you mean" in e.value.what and "nf4-dq" in e.value.allowed


def test_only_bitsandbytes_is_cuda_only():
    assert NF4.bnb and INT8.bnb and not TORCHAO_NF4.bnb and not NONE.on


def test_readme_lists_every_quantisation_spelling():
    from pathlib import Path
    from trainplan.quantization import spellings_table
    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    for name, spellings, meaning in spellings_table():
        assert f"| {name} | {spellings} | {meaning} |" in text, name


def test_paged_optimizer_states_never_count_against_the_fit():
    """bitsandbytes' paged optimizers keep their states in CUDA unified memory: outside the
    caching allocator (not in max_memory_allocated), on the device while there is room
    (nvidia-smi shows them), paged to host RAM when it runs short (QLoRA paper, section 3)."""
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.memory import estimate_memory
    job = tiny_job(optimizer="paged-adamw", num_layers=4)
    tr = trace(job)
    m = estimate_memory(tr, get_accelerator("a100-sxm4-80gb"), job)
    states = m.breakdown_bytes["optimizer_states"]
    assert states == pytest.approx(8 * tr.params_trainable, rel=0.02)    # fp32 moments
    assert m.peak_allocated_bytes == sum(m.breakdown_bytes[k] for k in (
        "weights", "gradients", "activations", "temporaries"))           # states left out
    assert m.device_used_bytes == sum(m.breakdown_bytes.values())       # ... but on the device
    assert m.held_bytes == m.device_used_bytes - states
