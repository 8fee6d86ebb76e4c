"""Generation (prefill + decode) model: trace/generate.py and predict/generation.py."""
import pytest

from conftest import tiny_job
from trainplan.accelerators import get_accelerator
from trainplan.models.hf import make_config
from trainplan.models.hf_names import load_config_dict
from trainplan.predict.generation import estimate_generation, step_cost
from trainplan.predict.target import semantics_for
from trainplan.predict.time_params import bundled
from trainplan.spec import Job, validate
from trainplan.trace.facts import kv_cache_bytes
from trainplan.trace.generate import kv_dims, trace_forward

QWEN = "hf:Qwen/Qwen2.5-0.5B"
B, P, C = 2, 64, 128


@pytest.fixture(scope="module")
def qwen():
    """Qwen2.5-0.5B pure fp16 (GQA: 14 query heads, 2 KV heads): prefill and two decode steps,
    traced once on the H100's kernel semantics (flash; T4 would pick efficient, same bytes)."""
    job = validate(Job(model=QWEN, batch_size=B, seq_len=P, precision="fp16"))
    sem = semantics_for(job, get_accelerator("h100-sxm"))
    return job, {"prefill": trace_forward(job, sem, B, P, 0),
                 "d0": trace_forward(job, sem, B, 1, P),
                 "d1": trace_forward(job, sem, B, 1, P + C - 2)}


def test_kv_dims_and_cache_bytes_match_closed_form(qwen):
    job, tr = qwen
    cfg = make_config(load_config_dict(QWEN[3:])[0])
    assert kv_dims(cfg) == (24, 2, 64)          # 896 / 14 heads; num_key_value_heads = 2
    for t in tr.values():
        tokens = t.batch_size * (t.context + t.new_tokens)
        assert t.kv_cache_bytes == kv_cache_bytes(24, 2, 64, tokens, 2) > 0
        assert t.peak_bytes >= t.weight_bytes + t.kv_cache_bytes
    # the reference transformer's cached attention holds the same closed form (MHA, 4 heads)
    tiny = trace_forward(tiny_job(precision="bf16"), semantics_for(
        tiny_job(), get_accelerator("h100-sxm")), 3, 1, 20)
    assert tiny.kv_cache_bytes == kv_cache_bytes(2, 4, 16, 3 * 21, 2)


@pytest.mark.parametrize("accel", ["t4", "h100-sxm"])
def test_decode_never_below_bandwidth_floor(qwen, accel):
    """A decode step reads every weight and the whole cache at least once."""
    job, tr = qwen
    a = get_accelerator(accel)
    for key in ("d0", "d1"):
        t = tr[key]
        read = t.weight_bytes + kv_cache_bytes(t.layers, t.kv_heads, t.head_dim,
                                               t.batch_size * t.context, t.kv_dtype_bytes)
        cost = step_cost(t, a, job.precision, bundled())
        floor = read / a.memory_bandwidth_bytes_per_s
        assert cost.memory_s + cost.compute_s >= floor
        assert cost.time("vllm") >= floor and cost.time("hf") >= floor


def test_decode_grows_with_context_and_prefill_is_compute(qwen):
    job, tr = qwen
    h100, p = get_accelerator("h100-sxm"), bundled()
    c0, c1 = (step_cost(tr[k], h100, job.precision, p) for k in ("d0", "d1"))
    assert tr["d1"].bytes_moved > tr["d0"].bytes_moved
    assert c1.device_s > c0.device_s
    # prefill: ~2 x non-embedding params x tokens (Kaplan et al. 2020); the tied embedding is a
    # lookup, the LM head runs on the last position only (generate's logits_to_keep=1)
    cfg = make_config(load_config_dict(QWEN[3:])[0])
    pre = tr["prefill"]
    n = pre.params_total - cfg.vocab_size * cfg.hidden_size
    assert pre.flops == pytest.approx(2 * n * B * P, rel=0.03)
    # arithmetic intensity: a decode step does ~1 FLOP per weight byte and sequence, the prefill
    # ~1 per weight byte and token: B x P = 128 tokens is compute-bound on a T4 (its ridge
    # point 65e12 x 0.566 / 320e9 = 115 FLOP/B), not yet on an H100 (~300 FLOP/B)
    assert pre.flops / pre.bytes_moved > 20 * tr["d0"].flops / tr["d0"].bytes_moved
    cp = step_cost(pre, get_accelerator("t4"), job.precision, p)
    assert cp.compute_s > cp.memory_s


def test_hf_engine_on_tiny_model_is_host_bound():
    job = tiny_job(precision="bf16")
    h100 = get_accelerator("h100-sxm")
    hf = estimate_generation(job, h100, prompts=2, prompt_len=16, completion_len=8)
    assert hf.bound == "kernel launches (host)"
    # host-bound: a decode step is the host queue's, its dispatch plus the last kernel's tail
    # after it (predict/host.py), far above the device's own time
    first = hf.steps["decode_first"]
    assert hf.per_token_s_first == pytest.approx(first.queued_s)
    assert first.host_s <= first.queued_s <= 1.05 * first.host_s and first.device_s < first.host_s
    vllm = estimate_generation(job, h100, prompts=2, prompt_len=16, completion_len=8,
                               engine="vllm")
    assert vllm.bound != "kernel launches (host)" and vllm.total_s < hf.total_s
    assert vllm.peak_bytes >= int(0.9 * h100.usable_memory_bytes)   # vLLM's reservation (floored)


def test_zero3_on_two_t4_is_weight_gather_bound(qwen):
    job = validate(Job(model=QWEN, batch_size=B, seq_len=32, precision="fp16"))
    t4 = get_accelerator("t4")
    e = estimate_generation(job, t4, prompts=2, generations_per_prompt=2, prompt_len=32,
                            completion_len=16, sharded_weights_devices=2)
    assert e.bound == "weight gather"
    weights = qwen[1]["d0"].weight_bytes                              # fp16, all of them
    assert e.per_token_s_first >= weights / 2 / t4.interconnect_bytes_per_s
    assert any("all-gathers" in n for n in e.notes)
    assert e.kv_cache_bytes == kv_cache_bytes(24, 2, 64, 4 * (32 + 16), 2)
    assert e.tokens_per_s == pytest.approx(4 * 16 / e.total_s)


def test_summed_decode_equals_affine_closed_form():
    """The closed-form sum over contexts equals tracing every decode step (tiny model)."""
    job = tiny_job(precision="bf16")
    a = get_accelerator("h100-sxm")
    prompt, completion, seqs = 8, 6, 3
    e = estimate_generation(job, a, prompts=seqs, prompt_len=prompt, completion_len=completion,
                            engine="vllm")
    sem, p = semantics_for(job, a), bundled()
    steps = [step_cost(trace_forward(job, sem, seqs, 1, t), a, job.precision, p).time("vllm")
             for t in range(prompt, prompt + completion - 1)]
    assert e.decode_s == pytest.approx(sum(steps), rel=0.01)
    mid = steps[len(steps) // 2]
    assert mid == pytest.approx((steps[0] + steps[-1]) / 2, rel=0.01)
    assert e.per_token_s_last >= e.per_token_s_first


@pytest.mark.parametrize("model,precision,lora", [
    ("hf:Qwen/Qwen2.5-0.5B", "fp16", False),
    ("hf:meta-llama/Llama-3.2-1B", "bf16-amp", True),
    ("hf:openai-community/gpt2-medium", "fp16-amp", False),
])
def test_a_forward_traced_with_4_layers_reads_as_the_whole_stack(model, precision, lora):
    """trace/derive/stitch.py `whole_forward`: a prefill and a decode step traced with 4 of the
    model's 16-24 layers, the others read off the last (its ops, parameters, weights and cache,
    and the memory log repeated over every layer for the peak), equal the forward traced with
    all of them: the same ops, parameters, weight, KV cache and peak bytes."""
    from collections import Counter
    from trainplan.trace.derive.stitch import whole_forward
    from trainplan.trace.stack import HIGH
    from trainplan.spec import Lora
    job = validate(Job(model=model, batch_size=B, seq_len=P, precision=precision,
                       lora=Lora() if lora else None))
    sem = semantics_for(job, get_accelerator("a100-80gb"))

    def work(tr):
        return Counter((r.name, r.phase, r.dtype, r.family, round(r.flops), round(r.bytes))
                       for r in tr.ops)
    for new, context in ((P, 0), (1, P)):
        cut = trace_forward(job, sem, B, new, context, depth=HIGH)
        assert cut.stack is not None and cut.stack.traced == HIGH
        read, real = whole_forward(cut), trace_forward(job, sem, B, new, context)
        assert read is not None and work(read) == work(real)
        for field in ("params_total", "weight_bytes", "kv_cache_bytes", "peak_bytes", "layers"):
            assert getattr(read, field) == getattr(real, field), field
        assert "alike layers" in read.notes[-1]
