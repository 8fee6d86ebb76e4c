"""Mixture-of-Experts models on fake tensors: closed forms for a tiny Mixtral, the routing
assumption (uniform and dropless, or a capacity factor), every precision, and the bundled
Mixtral-8x7B (trace/moe.py).

Tiny Mixtral: hidden h = 64, expert intermediate i = 96, L = 2 layers, E = 4 experts, top-k = 2,
vocab V = 128, 4 heads of 16 with 2 KV heads; batch 2 x 32 tokens, T = 64 tokens, S = T*k = 128
routed (token, expert) pairs.
"""
import json
import math

import pytest
import torch

from trainplan.errors import TrainplanError
from trainplan.spec import Job, Lora, validate
from trainplan.trace.moe import Routing
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

H, I, L, E, K, V, KV = 64, 96, 2, 4, 2, 128, 32     # KV: 2 KV heads x head dim 16
B, SEQ = 2, 32
T = B * SEQ
S = T * K

AUTOCAST = {"fp32": None, "bf16": None, "fp16": None, "bf16-amp": torch.bfloat16,
            "fp16-amp": torch.float16}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_local_experts": E, "num_experts_per_tok": K,
           "vocab_size": V, "max_position_embeddings": 256, "hidden_act": "silu",
           "tie_word_embeddings": False, "router_jitter_noise": 0.0}
    path = tmp_path_factory.mktemp("moe") / "config.json"
    path.write_text(json.dumps(cfg))
    return f"hf:{path}"


def _trace(model, precision="fp32", routing=None, **kw):
    job = validate(Job(model=model, batch_size=B, seq_len=SEQ, precision=precision, **kw))
    # torch >= 2.13's kernels: fp32 grouped-query attention in the memory-efficient kernel, not
    # the math path older releases take (semantics.py), so no attention matmul in the matmul FLOPs
    sem = KernelSemantics(attention="flash", autocast_dtype=AUTOCAST[precision],
                          efficient_gqa=True)
    return trace_step(job, sem, routing=routing)


def _grouped(tr, phase=None) -> float:
    return sum(r.flops for r in tr.ops if r.name == "_grouped_mm" and phase in (None, r.phase))


def _experts_activations(tr, layer=0) -> int:
    return next(m for m in tr.modules if m.name == f"model.layers.{layer}.mlp.experts"
                ).activation_bytes


def _expert_saved_bytes(rows: int, elem: int, index_vectors: int = 3) -> int:
    """What transformers' grouped-GEMM experts keep for backward, per layer, for `rows` routed
    rows, each storage rounded up to the allocator's 512 bytes: the gathered input (rows, h), the
    gate_up output (rows, 2i), silu(gate) and silu(gate)*up (rows, i) each, the down output
    (rows, h), all in the experts' compute dtype; int64 index vectors (transformers: the gather,
    the routing-weight gather and the un-permute; the capacity path's scatter_add reuses the
    gather's); the fp32 routing weights (rows, 1); the E int32 offsets."""
    def rnd(n):
        return -(-n // 512) * 512
    sizes = [rows * n * elem for n in (H, 2 * I, I, I, H)] + [rows * 8] * index_vectors + \
        [rows * 4, E * 4]
    return sum(rnd(n) for n in sizes)


def test_params_closed_form_and_every_expert_is_trained(tiny):
    tr = _trace(tiny)
    attn = 2 * H * H + 2 * H * KV
    per_layer = attn + E * H + E * 3 * H * I + 2 * H     # attention, router, experts, 2 norms
    total = V * H + L * per_layer + H + H * V           # embed, layers, final norm, lm_head
    assert tr.params_total == tr.params_trainable == total == 189_248
    # gradients and AdamW's two moments cover all E experts of every layer
    assert tr.gradient_bytes == 4 * total
    assert tr.optimizer_state_bytes == pytest.approx(8 * total, abs=512 * 2 * 30)


def test_flops_closed_form(tiny):
    """Experts: gate_up (2i x h) and down (h x i) grouped GEMMs over the S routed rows: forward
    2*S*h*2i + 2*S*i*h = 6*S*h*i, backward twice that (input and weight gradients): 18*S*h*i
    per layer. Every other matmul is a dense linear at 6*T*in*out (router included)."""
    tr = _trace(tiny)
    assert _grouped(tr, "forward") == 6 * S * H * I * L
    assert _grouped(tr, "backward") == 12 * S * H * I * L
    dense = L * (2 * H * H + 2 * H * KV + H * E) + H * V
    matmul = sum(tr.flops[ph]["matmul"] for ph in ("forward", "backward"))
    assert matmul == 6 * T * dense + 18 * S * H * I * L
    assert any("uniform and dropless" in n for n in tr.notes)


@pytest.mark.parametrize("precision,elem", [("fp32", 4), ("bf16", 2), ("bf16-amp", 4)])
def test_uniform_routing_activations_count_routed_rows(tiny, precision, elem):
    """Activations hold S = T*k rows (not T*E). Under AMP the experts compute in fp32: transformers
    calls _grouped_mm(input.to(weight.dtype), weight) with the fp32 master weight and autocast
    has no rule for _grouped_mm, as on CUDA."""
    tr = _trace(tiny, precision)
    assert _experts_activations(tr) == _expert_saved_bytes(S, elem)
    dtypes = {r.dtype for r in tr.ops if r.name == "_grouped_mm"}
    assert dtypes == {"float32" if elem == 4 else "bfloat16"}


def test_capacity_factor_scales_expert_work(tiny):
    """Capacity c: every expert computes C = ceil(c*S/E) rows, padded: expert FLOPs and
    activations are those of E*C rows; c = 1 equals dropless uniform routing (S/E integral)."""
    dropless = _trace(tiny)
    by_c = {c: _trace(tiny, routing=Routing(c)) for c in (1.0, 1.25, 2.0)}
    assert _grouped(by_c[1.0]) == _grouped(dropless)
    assert _experts_activations(by_c[1.0]) == _expert_saved_bytes(S, 4, index_vectors=2)
    for c, tr in by_c.items():
        rows = E * math.ceil(c * S / E)
        assert _grouped(tr) == 18 * rows * H * I * L
        assert _experts_activations(tr) == _expert_saved_bytes(rows, 4, index_vectors=2)
        assert any(f"capacity factor {c:g}" in n for n in tr.notes)
    assert _grouped(by_c[2.0]) == 2 * _grouped(dropless)
    grown = by_c[2.0].activation_bytes - by_c[1.0].activation_bytes
    assert grown == L * S * ((2 * H + 4 * I) * 4 + 2 * 8 + 4)   # S more rows per layer
    assert by_c[1.25].activation_bytes > by_c[1.0].activation_bytes
    # parameters, gradients and optimizer states do not depend on the routing
    assert by_c[2.0].gradient_bytes == dropless.gradient_bytes
    with pytest.raises(TrainplanError):
        Routing(0.5)


@pytest.mark.parametrize("precision", ["fp32", "bf16-amp", "fp16-amp", "bf16"])
def test_every_precision_with_lora_and_checkpointing(tiny, precision):
    """Experts traced in every precision; with LoRA (experts frozen) only the input gradients of
    the grouped GEMMs remain; full checkpointing recomputes the experts' forward."""
    compute = {"bf16": "bfloat16"}.get(precision, "float32")
    plain = _trace(tiny, precision)
    assert {r.dtype for r in plain.ops if r.name == "_grouped_mm"} == {compute}
    lora = _trace(tiny, precision, lora=Lora(rank=16))
    assert lora.params_trainable < lora.params_total
    assert _grouped(lora, "forward") == 6 * S * H * I * L
    assert _grouped(lora, "backward") == 6 * S * H * I * L
    ckpt = _trace(tiny, precision, grad_checkpointing="full")
    assert _grouped(ckpt) == _grouped(plain) + 6 * S * H * I * L
    assert ckpt.recompute_flops >= 6 * S * H * I * L
    assert ckpt.activation_bytes < plain.activation_bytes


@pytest.mark.parametrize("cfg,moe_i", [
    ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
      "intermediate_size": 128, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 64, "num_experts": E, "decoder_sparse_step": 1,
      "mlp_only_layers": [], "norm_topk_prob": False}, 32),
    ({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "intermediate_size": 64,
      "head_dim": 16, "num_local_experts": E, "sliding_window": 16,
      "layer_types": ["sliding_attention", "full_attention"]}, 64),
], ids=["qwen2_moe", "gpt_oss"])
def test_other_moe_families(tmp_path, cfg, moe_i):
    """Qwen2-MoE (shared expert, softmax router) and GPT-OSS (transposed experts with biases, its
    own clamped gate) run the same grouped GEMMs: 18*S*h*i per layer."""
    cfg = {"hidden_size": H, "num_hidden_layers": L, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_experts_per_tok": K, "vocab_size": V,
           "max_position_embeddings": 256, "tie_word_embeddings": False, **cfg}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    for precision in ("fp32", "bf16-amp"):
        tr = _trace(f"hf:{path}", precision)
        assert _grouped(tr) == 18 * S * H * moe_i * L


def test_mixtral_8x7b_bundled_bf16_amp():
    """The bundled Mixtral-8x7B: the published 46.7B parameters (46,702,792,704, all 8 experts),
    gradients and AdamW states for all of them, expert FLOPs and activations for top-2 of 8."""
    h, i, layers, seq = 4096, 14336, 32, 256
    job = validate(Job(model="hf:mistralai/Mixtral-8x7B-v0.1", batch_size=1, seq_len=seq,
                       precision="bf16-amp"))
    tr = trace_step(job, KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16))
    assert tr.params_total == tr.params_trainable == 46_702_792_704
    assert tr.gradient_bytes == 4 * tr.params_total
    assert tr.optimizer_state_bytes == pytest.approx(8 * tr.params_total, rel=1e-6)
    rows = seq * 2
    assert _grouped(tr) == 18 * rows * h * i * layers
    assert _experts_activations(tr) == rows * ((2 * h + 4 * i) * 4 + 3 * 8 + 4) + 512


# -- expert parallelism (predict/sharding.py, predict/timing.py) ---------------------------------

def test_expert_footprint_counts_every_expert(tiny):
    tr = _trace(tiny)
    # gate_up (E, 2I, H) + down (E, H, I), fp32
    assert tr.expert_param_bytes == L * E * (2 * I * H + H * I) * 4
    assert tr.expert_trainable_bytes == tr.expert_param_bytes
    assert tr.moe_dispatch_elements == L * T * K * H


def test_expert_parallel_divides_the_replicated_experts(tiny):
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.memory import estimate_memory
    tr = _trace(tiny)
    a100 = get_accelerator("a100-sxm4-80gb")
    job = validate(Job(model=tiny, batch_size=B, seq_len=SEQ, gpus=4, strategy="ddp"))
    one = estimate_memory(tr, a100, job).breakdown_bytes
    ep = estimate_memory(tr, a100, job.with_(expert_parallel=4)).breakdown_bytes
    w = tr.expert_param_bytes
    # DDP replicates: each rank keeps 1/4 of the experts' weights (and of their gradients, states)
    assert one["weights"] - ep["weights"] == pytest.approx(w * 3 / 4, rel=1e-3)
    assert ep["optimizer_states"] < one["optimizer_states"]
    # ZeRO-3 shards everything over N already: experts over N/ep ranks is the same 1/N
    z3 = job.with_(strategy="zero3")
    assert estimate_memory(tr, a100, z3.with_(expert_parallel=4)).breakdown_bytes["weights"] == \
        estimate_memory(tr, a100, z3).breakdown_bytes["weights"]


def test_expert_parallel_adds_all_to_alls(tiny):
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.comm import collective_s
    from trainplan.predict.timing import estimate_step_time
    tr = _trace(tiny)
    h100 = get_accelerator("h100-sxm")
    job = validate(Job(model=tiny, batch_size=B, seq_len=SEQ, gpus=4, strategy="ddp"))
    base = estimate_step_time(tr, h100, job)
    ep = estimate_step_time(tr, h100, job.with_(expert_parallel=4))
    a2a = 4 * collective_s("all_to_all", L * T * K * H * 4, 4, h100)
    assert ep.step_time_s - base.step_time_s == pytest.approx(a2a, rel=1e-6)


def test_expert_parallel_must_divide_the_gpus(tiny):
    with pytest.raises(TrainplanError) as e:
        validate(Job(model=tiny, gpus=4, strategy="ddp", expert_parallel=3))
    assert "divide" in e.value.what


def test_qlora_quantizes_the_3d_experts_and_runs_them_in_the_compute_dtype(tiny):
    """QLoRA quantises every expert as it quantises every Linear (bitsandbytes did each expert's
    Linear under transformers 4): the experts' weights take nf4's bytes, not fp32's, and their
    grouped GEMMs compute in bf16, the compute dtype, instead of fp32 under AMP."""
    lora = Lora(rank=4, targets="q_proj,v_proj")
    full = _trace(tiny, "bf16-amp", lora=lora)
    q = _trace(tiny, "bf16-amp", lora=lora, quantize="nf4")
    expert_params = L * E * (2 * I * H + H * I)
    assert full.expert_param_bytes == 4 * expert_params
    assert q.expert_param_bytes == expert_params // 2     # 4-bit codes (the absmax: buffers)
    dtypes = {r.dtype for r in q.ops if r.name == "_grouped_mm"}
    assert dtypes == {"bfloat16"}
    assert _grouped(q) == pytest.approx(_grouped(full))          # same routed FLOPs
