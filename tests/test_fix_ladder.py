"""The fix ladder against the libraries (issue 45): the order is one data table, sorted by what a
rung costs the user; and every rung's effect, traced both ways on a small model, equals the value
derived from the library's own code (each check names the line it rests on). The matrix: full
fine-tuning, LoRA and QLoRA, on one and on two devices, each rung."""
import math
from pathlib import Path

import pytest

from conftest import tiny_job, trace
from trainplan.accelerators import get_accelerator
from trainplan.plan import fixes
from trainplan.predict import Traces, evaluate
from trainplan.predict.memory import _transform
from trainplan.spec import Job, Lora, validate

CFG = Path(__file__).parent / "data" / "tiny-llama" / "config.json"
H, FFN, LAYERS, VOCAB = 64, 128, 2, 512            # tests/data/tiny-llama/config.json
A100 = get_accelerator("a100-sxm4-80gb")
# its linears: q, k, v, o (H x H), gate, up (H -> FFN), down (FFN -> H); the head is untied
LINEARS = [(H, H)] * 4 + [(H, FFN)] * 2 + [(FFN, H)]
BASE_PARAMS = 2 * VOCAB * H + LAYERS * (sum(i * o for i, o in LINEARS) + 2 * H) + H
FROZEN_FLOATING_QLORA = 2 * VOCAB * H + LAYERS * 2 * H + H      # embeddings, head, norms
ROUND = 512                     # the CUDA caching allocator's granularity (trace/counters.py)
_TRACES = Traces()


def r512(n: int) -> int:
    return -(-n // ROUND) * ROUND


def job(regime: str = "full", devices: int = 1, **kw) -> Job:
    base = dict(model=f"hf:{CFG}", task="causal-lm", batch_size=2, seq_len=64,
                precision="bf16-amp", optimizer="adamw", gpus=devices)
    if regime in ("lora", "qlora"):
        base["lora"] = Lora(rank=8, alpha=16.0, targets="all-linear", dropout=0.0)
    if regime == "qlora":
        base["quantize"] = "nf4-dq"
    base.update(kw)
    return validate(Job(**base))


def ev(j: Job):
    return evaluate(j, A100, traces=_TRACES, strict=False)


def rung_job(name: str, j: Job) -> Job | None:
    r = fixes.RUNGS[name](j, A100, j.gpus)
    return r.job if isinstance(r, fixes.Step) else None


MATRIX = [(regime, devices) for regime in ("full", "lora", "qlora") for devices in (1, 2)]


# --- the order --------------------------------------------------------------------------------

def test_the_order_is_one_table_sorted_by_cost_then_step_time():
    t = fixes.table()
    costs, times = list(t["costs"]), list(t["times"])
    keys = [(costs.index(r["cost"]), times.index(r["time"])) for r in t["rungs"]]
    assert keys == sorted(keys)
    assert [r["rung"] for r in t["rungs"]] == list(fixes.RUNGS)     # every rung has its row
    for r in t["rungs"]:
        assert r["user_change"] and r["effect"] and r["source"], r["rung"]
    ladder = [fixes.RUNGS[r["rung"]] for r in t["rungs"] for _ in range(r.get("repeat", 1))]
    assert list(fixes.LADDER) == ladder
    order = [r["rung"] for r in t["rungs"]]
    # a setting in the same script first; a new launcher, and DeepSpeed on one device, last
    assert order.index("frozen-half") < order.index("optimizer-paged") < order.index("qlora") \
        < order.index("seq-len") < order.index("zero2") < order.index("offload-optimizer")


# --- each rung's delta, against the library ---------------------------------------------------

@pytest.mark.parametrize("regime,devices", MATRIX)
def test_frozen_half(regime, devices):
    """peft/utils/other.py prepare_model_for_kbit_training: "cast all non INT8 parameters to
    fp32" -- undone, every frozen floating-point parameter takes 2 bytes instead of 4."""
    j = job(regime, devices)
    new = rung_job("frozen-half", j)
    if regime == "full":
        assert new is None                       # nothing is frozen
        return
    frozen = BASE_PARAMS if regime == "lora" else FROZEN_FLOATING_QLORA
    assert ev(j).trace.weight_bytes - ev(new).trace.weight_bytes == 2 * frozen


@pytest.mark.parametrize("regime,devices", MATRIX)
def test_optimizer_8bit(regime, devices):
    """bitsandbytes/optim/optimizer.py Optimizer2State.init_state: tensors of at least
    min_8bit_size = 4096 elements keep two uint8 states and an fp32 absmax per 256 (blocksize
    256); smaller ones keep fp32 states. torch AdamW: two fp32 states (zeros_like(param))."""
    j = job(regime, devices)
    tr = ev(j).trace
    new = ev(rung_job("optimizer-8bit", j)).trace
    sizes = _trainable_sizes(regime)
    saved = sum(2 * r512(4 * n) - (2 * r512(n) + 2 * r512(4 * math.ceil(n / 256)))
                for n in sizes if n >= 4096)
    assert tr.optimizer_state_bytes - new.optimizer_state_bytes == saved
    if regime != "full":
        assert saved == 0                         # every adapter is under 4096 elements


@pytest.mark.parametrize("regime,devices", MATRIX)
def test_optimizer_paged(regime, devices):
    """bitsandbytes paged optimizers allocate their states with cudaMallocManaged (outside the
    caching allocator): they stay on the device while it has room and never cause an OOM, so
    they leave what must fit (predict/memory.py)."""
    j = rung_job("optimizer-8bit", job(regime, devices)) or job(regime, devices)
    eight = ev(j).memory
    paged = ev(rung_job("optimizer-paged", j)).memory
    assert paged.peak_phase == eight.peak_phase
    states = eight.breakdown_bytes["optimizer_states"]
    assert eight.peak_allocated_bytes - paged.peak_allocated_bytes == states
    assert paged.breakdown_bytes["optimizer_states"] == states      # still shown on the device


@pytest.mark.parametrize("regime,devices", MATRIX)
def test_lora_and_a_smaller_lora(regime, devices):
    """peft LoraConfig: r (in + out) trainable weights an adapted linear (Hu et al. 2021); the
    rung asks rank 16 on all linear layers but the head; a smaller LoRA halves the rank."""
    j = job(regime, devices)
    per_rank = LAYERS * sum(i + o for i, o in LINEARS)
    if regime == "full":
        assert ev(rung_job("lora", j)).trace.params_trainable == 16 * per_rank
        assert rung_job("lora-smaller", j) is None
        return
    assert rung_job("lora", j) is None
    smaller = rung_job("lora-smaller", j)
    assert smaller.lora.rank == 4 and ev(smaller).trace.params_trainable == 4 * per_rank
    attention_only = rung_job("lora-smaller", smaller)
    assert ev(attention_only).trace.params_trainable == 4 * LAYERS * 4 * (H + H)


@pytest.mark.parametrize("regime,devices", MATRIX)
def test_qlora(regime, devices):
    """bitsandbytes functional.quantize_4bit: two codes a byte, an absmax per 64 weights,
    double-quantised (bnb_4bit_use_double_quant) to 8 bits with an fp32 scale per 256 of them and
    one fp32 offset (Dettmers et al. 2023, section 3). Every linear but the head is quantised
    (transformers get_keys_to_not_convert)."""
    j = job(regime, devices)
    new = rung_job("qlora", j)
    if regime != "lora":
        assert new is None
        return
    def nf4_dq(n):
        blocks = math.ceil(n / 64)
        return n // 2 + blocks + 4 * math.ceil(blocks / 256) + 4
    packed = LAYERS * sum(nf4_dq(i * o) for i, o in LINEARS)
    tr = ev(new).trace
    assert tr.packed_weight_bytes == packed
    quantised = LAYERS * sum(i * o for i, o in LINEARS)
    assert ev(j).trace.weight_bytes - tr.weight_bytes == 4 * quantised - packed


@pytest.mark.parametrize("regime,devices", MATRIX)
def test_freeze_embeddings(regime, devices):
    """requires_grad_(False) on the input embedding: its gradient and state are never made."""
    j = job(regime, devices)
    tr = ev(j).trace
    r = fixes.freeze_embeddings(j, A100, devices, trace=tr)
    if regime != "full":
        assert r is None
        return
    assert tr.params_trainable - ev(r.job).trace.params_trainable == VOCAB * H


@pytest.mark.parametrize("regime", ("full", "lora", "qlora"))
@pytest.mark.parametrize("stage", ("zero2", "zero3"))
def test_zero_over_two_devices(regime, stage):
    """DeepSpeed: the fp16/bf16 engine casts the module to 16 bits (engine.py:1224-1237
    module.half(): floating-point tensors only, so 4-bit storage stays as it is); ZeRO keeps the
    fp32 master weights and Adam's two states of the trainable parameters, K = 12 bytes each,
    partitioned over the N devices (Rajbhandari et al. 2020 section 3.1; stage_1_and_2.py:398-409),
    and ZeRO-3 partitions the 16-bit parameters too (stage3.py:703-767)."""
    j = job(regime, 2)
    z = rung_job(stage, j)
    tr = ev(z).trace
    cats = dict(tr.phase_peaks["optimizer"][1])
    out = _transform(cats, z, tr, "optimizer", devices=2)
    p = tr.params_trainable
    assert abs(out["optimizer_states"] - 12 * p / 2) <= ROUND * len(_trainable_sizes(regime))
    cast = tr.packed_weight_bytes + 2 * tr.floating_weight_elements
    tensors = 3 + LAYERS * 30        # the phase's weights are allocations, each rounded up
    assert out["weights"] == pytest.approx(cast / (2 if stage == "zero3" else 1),
                                           abs=ROUND * tensors)
    if regime == "full":                     # fp32 masters of AMP: the 16-bit model is half
        assert out["weights"] == pytest.approx(cats["weights"] / (2 if stage == "zero2" else 4),
                                               rel=0.01)
    if regime == "qlora":
        assert tr.packed_weight_bytes == ev(j).trace.packed_weight_bytes   # 4-bit: no cast
    if regime != "full":
        assert z.frozen_half == "all"             # the engine's cast, in the trace as well


@pytest.mark.parametrize("regime", ("full", "lora", "qlora"))
def test_offload_on_one_device(regime):
    """ZeRO-Offload: optimizer states, fp32 masters and the gradient partition in host memory
    (stage_1_and_2.py:405-406, 682-690); with ZeRO-3 parameter offload the 16-bit partitions
    too (stage3.py:690-701): none of them on the device in any phase."""
    j = job(regime, 1)
    opt = rung_job("offload-optimizer", j)
    assert opt.strategy.name == "zero2" and opt.offload == "optimizer"
    tr = ev(opt).trace
    for phase, (_, cats) in tr.phase_peaks.items():
        assert _transform(dict(cats), opt, tr, phase, devices=1)["optimizer_states"] == 0
    params = rung_job("offload-params", opt)
    tr = ev(params).trace
    for phase, (_, cats) in tr.phase_peaks.items():
        assert _transform(dict(cats), params, tr, phase, devices=1)["weights"] == 0


@pytest.mark.parametrize("regime,devices", MATRIX)
def test_mixed_precision_keeps_fp32_masters(regime, devices):
    """torch.autocast casts ops, not parameters: the weights stay fp32 (AMP's master copy)."""
    j = job(regime, devices, precision="fp32")
    new = rung_job("precision", j)
    assert new.precision.name == "bf16-amp"
    assert ev(new).trace.weight_bytes == ev(j).trace.weight_bytes


def test_full_checkpointing_keeps_each_block_input():
    """torch.utils.checkpoint saves only a block's inputs: one block more keeps one more
    b x s x h activation (Korthikanti et al. 2022: 2sbh per layer in 16 bits, 4sbh in fp32)."""
    b, s, h = 2, 32, 64
    a = [trace(tiny_job(num_layers=n, precision="fp32", grad_checkpointing="full"))
         for n in (2, 3)]
    assert a[1].activation_bytes - a[0].activation_bytes == r512(b * s * h * 4)


def test_selective_checkpointing_saves_every_other_matmul():
    """torchtitan's op policy (_apply_ac_to_transformer_block, _custom_policy): the attention
    kernels always, the mm outputs only every other time, counted apart in the forward and the
    backward's rerun."""
    from torch.utils.checkpoint import CheckpointPolicy
    from trainplan.trace.checkpointing import _sac_policy, aten

    class Ctx:
        def __init__(self, rerun):
            self.is_recompute = rerun
    policy = _sac_policy({})
    saved = [policy(Ctx(False), aten.mm.default) == CheckpointPolicy.MUST_SAVE for _ in range(7)]
    assert saved == [True, False, True, False, True, False, True]
    assert policy(Ctx(True), aten.mm.default) == CheckpointPolicy.MUST_SAVE    # rerun: its own
    assert policy(Ctx(False), aten._scaled_dot_product_flash_attention.default) == \
        CheckpointPolicy.MUST_SAVE
    assert policy(Ctx(False), aten.add.Tensor) == CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("dropout,kept", [(0.0, 4), (0.1, 9)])
def test_attention_rung_drops_the_scores(dropout, kept):
    """Eager attention keeps each layer's b x heads x s x s probabilities for backward: softmax's
    output (fp32, 4 bytes), and with dropout the fused kernel's bool mask (1) and its output (4)
    for the matmul with V. SDPA's memory-efficient kernel keeps its output and one log-sum-exp
    per row instead (pytorch _scaled_dot_product_efficient_attention; Rabe & Staats 2021)."""
    import dataclasses
    b, heads, s, layers = 2, 4, 64, 2
    j = tiny_job(precision="fp32", seq_len=s, attention="eager")
    j = j.with_(transformer=dataclasses.replace(j.transformer, dropout=dropout))
    new = rung_job("attention", j)
    assert new.attention == "sdpa"
    delta = trace(j, attention="eager").activation_bytes - \
        trace(new, attention="efficient").activation_bytes
    assert delta == pytest.approx(layers * b * heads * s * s * kept, abs=layers * 4096)


def test_a_shorter_sequence_halves_what_scales_with_it():
    """With flash / memory-efficient attention every activation is per token: half the sequence,
    half of them (up to the allocator's 512-byte rounding of each tensor)."""
    full = trace(tiny_job(seq_len=64, precision="fp32"))
    half = trace(tiny_job(seq_len=32, precision="fp32"))
    assert half.activation_bytes == pytest.approx(full.activation_bytes / 2, rel=0.02)


def _trainable_sizes(regime: str) -> list[int]:
    """Element counts of the trainable tensors of the tiny Llama under `regime`."""
    if regime == "full":
        return [VOCAB * H] * 2 + [H] + LAYERS * ([i * o for i, o in LINEARS] + [H, H])
    return LAYERS * [n for i, o in LINEARS for n in (8 * i, 8 * o)]
