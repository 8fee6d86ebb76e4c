"""Properties of the prediction core (predict/) over several kinds of model: a decoder LLM (GPT-2),
an encoder (BERT-base; both with 4 of their 12 blocks, which the properties do not depend on),
a convnet with depthwise convolutions (EfficientNet-B0), a ViT (ViT-Tiny) and a LoRA job (GPT-2 +
LoRA on q,v).

    (a) memory grows with the work: peak allocated and required bytes are non-decreasing in the
        micro-batch, and in the sequence length for the text models;
    (b) the largest micro-batch does not depend on the batch the question was asked with;
    (c) a trace read off the line through two real ones (trace/derive/interpolate.py: interpolated
        between the anchors 2 and 32, extrapolated beyond) equals the real trace at that batch
        within 1% on every field the memory and time models read, depthwise convolutions kept.

Real traces are deterministic, so every real trace is taken once per module: `trace_step`, as
the trace cache (trace/derive/cache.py) calls it, is memoised. Each `Traces` cache is still fresh where a test says so:
which batches a cache holds, and so what it interpolates, is what it would be without the memo.
Accelerator: the smallest GPU in the catalog (4 GiB), so that the searches stay short.
"""
from __future__ import annotations

import pytest

import trainplan.trace.derive.cache as cache_mod
import trainplan.trace.derive.traces as traces_mod
from trainplan.accelerators import get_accelerator
from trainplan.estimate import estimate
from trainplan.predict import Traces, evaluate, semantics_for
from trainplan.trace.derive.interpolate import same_shape_family
from trainplan.predict.evaluate import memory_at
from trainplan.predict.memory import estimate_memory
from trainplan.predict.timing import estimate_step_time
from trainplan.spec import Job, Lora, validate

from conftest import shallow

# the smallest GPU in the catalog (4 GiB): the largest micro-batches stay modest (tens to hundreds)
ACCEL = "rtx-3050-laptop-4gb"
BATCHES = (1, 2, 4, 8, 32, 64)           # (a): real traces at each; (c) compares with them
ASKED = (1, 2, 8, 24)                    # (b): the batch the estimate is asked about
SEQS = (64, 128, 256)                    # (a): text models
REL = 0.01

TEXT = ("gpt2", "bert", "gpt2-lora")
BLOCKS = 4        # GPT-2's and BERT-base's own blocks, 4 of their 12 (conftest.py `shallow`)


def _jobs() -> dict:
    gpt2 = dict(model=shallow("openai-community/gpt2", BLOCKS), seq_len=128, precision="bf16-amp",
                batch_size=1)
    return {
        "gpt2": validate(Job(**gpt2)),
        "bert": validate(Job(model=shallow("google-bert/bert-base-uncased", BLOCKS), seq_len=128,
                             precision="bf16-amp", batch_size=1)),
        "efficientnet": validate(Job(model="timm:efficientnet_b0", image_size=224,
                                     precision="bf16-amp", batch_size=1)),
        "vit": validate(Job(model="timm:vit_tiny_patch16_224", image_size=224,
                            precision="bf16-amp", batch_size=1)),
        "gpt2-lora": validate(Job(**gpt2, lora=Lora(rank=8, alpha=16, targets="q,v"))),
    }


JOBS = _jobs()
MODELS = tuple(JOBS)


@pytest.fixture(scope="module")
def accel():
    return get_accelerator(ACCEL)


@pytest.fixture(scope="module", autouse=True)
def real_traces():
    """Memoise the trace cache's one-at-a-time traces (cache.py `trace_one`): every real trace
    is taken once. The models are traced whole (no stack is cut: trace/stack.py MIN_BLOCKS), so
    that (c) compares one real trace with another; traces stitched from cut ones are checked in
    test_depth.py."""
    real = cache_mod.trace_one
    memo: dict[tuple, object] = {}

    def trace_one(request):
        job, sem, batch, depth = request
        key = repr(job), sem.key(), batch or job.batch_size, depth
        if key not in memo:
            memo[key] = real(request)
        return memo[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(cache_mod, "trace_one", trace_one)
    mp.setattr(traces_mod, "MIN_BLOCKS", 10**9)
    yield memo
    mp.undo()


@pytest.fixture(scope="module")
def traces():
    """One cache for (a): real traces only, at the batches (a) asks for."""
    return Traces()


def _memory(traces, job, accel, b):
    """Memory at micro-batch b as the prediction core reports it (predict.evaluate.memory_at,
    what `evaluate` and the largest-micro-batch search read): (peak allocated, required) bytes."""
    jb = job.with_(batch_size=b)
    _tr, _interp, mem = memory_at(jb, accel, traces, semantics_for(jb, accel), b)
    return mem.peak_allocated_bytes, mem.required_bytes


def _non_decreasing(xs) -> bool:
    return all(a <= b for a, b in zip(xs, xs[1:]))


# --- (a) memory is non-decreasing in micro-batch and sequence length ----------------------------

# required_bytes = CUDA context + allocated + the allocator replay's pinned fragmentation
# (predict/memory.py). The replay's fragmentation of one trace is not monotone: where the step's
# peak is the optimizer step (model states, the same at every micro-batch) the pinned bytes fall as
# activations grow (gpt2 bf16-amp seq 128 on one device: 353 MiB at b=1, 329 at 2, 184 at 4, 71 at
# 8). The core reads fragmentation off the line through its anchors' replays, never shrinking, so
# required memory is non-decreasing in the micro-batch. Across sequence lengths each length is its
# own job with its own anchors, and the replay's fragmentation can still fall with the tokens
# (the whole 12-block GPT-2, b=2: s64 2,732 MiB, s128 2,716 MiB, s256 2,584 MiB + context; the
# 4-block BERT here, b=2: s64 1,501.7 MiB, s128 1,495.7 MiB): an allocator-model gap left to
# issue 16 (the caching allocator), pinned here as a strict xfail.
REQUIRED_NOT_MONOTONE_IN_SEQ = pytest.mark.xfail(strict=True, reason=(
    "predict/memory.py: the allocator replay's pinned fragmentation falls as the sequence grows "
    "while the optimizer step holds the peak (4-block BERT b=2: s64 1,574,672,384 B > s128 "
    "1,568,380,928 B)"))


def _params(models, xfail_on=("bert",)):
    return [pytest.param(m, marks=REQUIRED_NOT_MONOTONE_IN_SEQ) if m in xfail_on else m
            for m in models]


@pytest.mark.parametrize("name", MODELS)
def test_peak_allocated_non_decreasing_in_micro_batch(name, traces, accel):
    peaks = [_memory(traces, JOBS[name], accel, b)[0] for b in BATCHES]
    assert _non_decreasing(peaks), dict(zip(BATCHES, peaks))
    assert peaks[-1] > peaks[0]            # and the activations do grow over 1..64


@pytest.mark.parametrize("name", MODELS)
def test_required_non_decreasing_in_micro_batch(name, traces, accel):
    req = [_memory(traces, JOBS[name], accel, b)[1] for b in BATCHES]
    assert _non_decreasing(req), dict(zip(BATCHES, req))


@pytest.mark.parametrize("name", TEXT)
def test_peak_allocated_non_decreasing_in_sequence_length(name, traces, accel):
    peaks = [_memory(traces, JOBS[name].with_(seq_len=s), accel, 2)[0] for s in SEQS]
    assert _non_decreasing(peaks), dict(zip(SEQS, peaks))


@pytest.mark.parametrize("name", _params(TEXT))
def test_required_non_decreasing_in_sequence_length(name, traces, accel):
    # 4 blocks, b=2: gpt2 s64 1,904,789,504  s128 1,922,091,008  s256 2,009,818,112
    #                bert s64 1,574,672,384  s128 1,568,380,928  s256 1,569,822,720
    req = [_memory(traces, JOBS[name].with_(seq_len=s), accel, 2)[1] for s in SEQS]
    assert _non_decreasing(req), dict(zip(SEQS, req))


@pytest.mark.parametrize("name", TEXT)
def test_the_floor_is_below_every_required_and_the_same_at_every_length_and_batch(name, traces,
                                                                                  accel):
    """MemoryEstimate.floor_bytes, what the fix ladder reads to skip shorter sequences that
    cannot fit (plan/planner.py): at most what any micro-batch or sequence length requires, and
    one number for them all (weights, optimizer states, gradients in the update, the runtime)."""
    floors, required = set(), []
    for s in SEQS:
        for b in (1, 2, 8):
            jb = JOBS[name].with_(seq_len=s, batch_size=b)
            mem = memory_at(jb, accel, traces, semantics_for(jb, accel), b)[2]
            floors.add(mem.floor_bytes)
            required.append(mem.required_bytes)
    assert len(floors) == 1 and 0 < floors.pop() <= min(required)


# --- (b) the largest micro-batch is the same whatever batch was asked ---------------------------

@pytest.mark.parametrize("name", MODELS)
def test_largest_micro_batch_does_not_depend_on_the_asked_batch(name, accel):
    job = JOBS[name]
    answers = {b: estimate(job.with_(batch_size=b), accel).max_batch_size for b in ASKED}
    assert len(set(answers.values())) == 1, answers
    largest = answers[1]
    assert largest is not None and 2 <= largest < 1024, answers      # a modest, real search
    # evaluate agrees with the search on the search's own traces: `largest` fits, one more not
    anchors_only = Traces()
    assert estimate(job, accel, traces=anchors_only).max_batch_size == largest
    assert evaluate(job.with_(batch_size=largest), accel, traces=anchors_only).memory.fits
    assert not evaluate(job.with_(batch_size=largest + 1), accel, traces=anchors_only).memory.fits


# --- (c) an interpolated trace equals the real one ---------------------------------------------

# (model, lo, hi, b): every micro-batch from 2 up is read off the line through the real traces at
# 2 and 32 (trace/derive/anchoring.py ANCHORS): interpolated at 4 and 8, extrapolated at 64. Micro-
# batch 1 is not on that line (a broadcast over a batch of one is a view, over more a copy; the
# transformers even run one op fewer at 1), so it is not an end of any case here.
LO, HI = 2, 32
CASES = [(m, LO, HI, b) for m in MODELS for b in (4, 8, 64)]


def _case_id(case) -> str:
    m, lo, hi, b = case
    return f"{m}-b{b}-from-{lo}-{hi}"


def _approx(x, rel=REL, abs=0.0):
    return pytest.approx(x, rel=rel, abs=abs)


@pytest.fixture(scope="module")
def pairs(accel):
    """case -> (trace at b read off the line through lo and hi, real trace at b); the first from a
    cache that holds only lo and hi, so `between` derives it and never returns a real trace."""
    out = {}
    for name, lo_b, hi_b, b in CASES:
        job = JOBS[name]
        sem = semantics_for(job, accel)
        only_ends = Traces()
        lo, hi = only_ends.exact(job, sem, lo_b), only_ends.exact(job, sem, hi_b)
        assert same_shape_family(lo, hi), (name, lo_b, hi_b)
        mid = only_ends.between(job, sem, b, lo_b, hi_b)
        assert only_ends.traced_batches(job, sem) == [lo_b, hi_b]
        assert mid.batch_size == b and mid.trace_seconds == 0.0         # derived, not traced
        out[name, lo_b, hi_b, b] = mid, Traces().exact(job, sem, b)
    return out


@pytest.mark.parametrize("name", MODELS)
def test_no_interpolation_across_different_ops(name, accel):
    # between 1 and 8: derived where the two traces run the same ops, else the real trace
    job = JOBS[name]
    sem = semantics_for(job, accel)
    t = Traces()
    lo, hi = t.exact(job, sem, 1), t.exact(job, sem, 8)
    mid = t.between(job, sem, 4, 1, 8)
    if same_shape_family(lo, hi):
        assert mid.trace_seconds == 0.0 and t.traced_batches(job, sem) == [1, 8]
    else:
        assert mid is t.exact(job, sem, 4) and t.traced_batches(job, sem) == [1, 4, 8]
    if name in TEXT:    # the broadcast position embedding: no `sum` over a batch of one
        assert not same_shape_family(lo, hi)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_interpolated_memory_fields_match_the_real_trace(case, pairs):
    mid, real = pairs[case]
    assert mid.peak_allocated_bytes == _approx(real.peak_allocated_bytes)
    assert mid.peak_phase == real.peak_phase
    assert mid.phase_peaks.keys() == real.phase_peaks.keys()
    for ph, (total, _cats) in real.phase_peaks.items():
        assert mid.phase_peaks[ph][0] == _approx(total), ph
    assert mid.activation_bytes == _approx(real.activation_bytes)
    assert mid.weight_cast_bytes == _approx(real.weight_cast_bytes, abs=64 * 1024)
    # model states do not depend on the batch, so they are copied, not interpolated
    for f in ("weight_bytes", "gradient_bytes", "optimizer_state_bytes", "trainable_param_bytes",
              "largest_block_param_bytes", "params_total", "params_trainable"):
        assert getattr(mid, f) == getattr(real, f), f
    assert len(mid.log.events) == len(real.log.events)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_interpolated_phase_peaks_by_category_and_sharded_memory_match(case, pairs, accel):
    mid, real = pairs[case]
    name, b = case[0], case[3]
    for ph, (total, cats) in real.phase_peaks.items():
        assert mid.phase_peaks[ph][1].keys() == cats.keys()
        for c, v in cats.items():      # within 1% of the phase's peak: what it adds to memory
            assert mid.phase_peaks[ph][1][c] == pytest.approx(v, rel=0, abs=REL * total), (ph, c)
    # the categories are what the strategies transform (predict/memory.py `_transform`)
    for strategy, gpus in (("zero2", 2), ("zero3", 4), ("ddp", 2)):
        jb = JOBS[name].with_(batch_size=b, strategy=strategy, gpus=gpus)
        m_mid, m_real = estimate_memory(mid, accel, jb), estimate_memory(real, accel, jb)
        assert m_mid.required_bytes == _approx(m_real.required_bytes), strategy
        assert m_mid.peak_allocated_bytes == _approx(m_real.peak_allocated_bytes), strategy


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_interpolated_work_matches_the_real_trace(case, pairs):
    mid, real = pairs[case]
    assert mid.flops.keys() == real.flops.keys()
    assert mid.bytes_moved.keys() == real.bytes_moved.keys()
    for ph, fams in real.flops.items():
        assert mid.flops[ph].keys() == fams.keys()
        for fam, v in fams.items():
            assert mid.flops[ph][fam] == _approx(v, abs=1.0), (ph, fam)
            moved = real.bytes_moved[ph][fam]
            assert mid.bytes_moved[ph][fam] == _approx(moved, abs=1024), (ph, fam)
    assert mid.recompute_flops == _approx(real.recompute_flops, abs=1.0)
    assert mid.flops_per_step == _approx(real.flops_per_step)
    assert mid.model_flops == _approx(real.model_flops)
    assert len(mid.ops) == len(real.ops)
    for i, (a, r) in enumerate(zip(mid.ops, real.ops)):
        assert (a.name, a.phase, a.family, a.dtype, a.recompute, a.group_channels) == (
            r.name, r.phase, r.family, r.dtype, r.recompute, r.group_channels), i
        assert a.flops == _approx(r.flops, abs=1.0), (i, a.name)
        assert a.bytes == _approx(r.bytes, abs=1024), (i, a.name)      # 512-byte rounding


def test_depthwise_convolutions_survive_interpolation(pairs):
    # the time model runs group_channels == 1 convolutions on CUDA cores (timing.py K_DWCONV)
    for case in [c for c in CASES if c[0] == "efficientnet"]:
        mid, real = pairs[case]
        dw_real = [i for i, o in enumerate(real.ops) if o.group_channels == 1]
        dw_mid = [i for i, o in enumerate(mid.ops) if o.group_channels == 1]
        assert dw_real and dw_mid == dw_real
        assert all("convolution" in real.ops[i].name for i in dw_real)
        assert any(o.group_channels > 1 for o in mid.ops)                  # the 1x1 / stem convs
    # and none in the transformers
    assert not any(o.group_channels == 1 for o in pairs["vit", LO, HI, 8][0].ops)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_interpolated_estimates_match_the_real_trace(case, pairs, accel):
    mid, real = pairs[case]
    name, b = case[0], case[3]
    jb = JOBS[name].with_(batch_size=b)
    m_mid, m_real = estimate_memory(mid, accel, jb), estimate_memory(real, accel, jb)
    assert m_mid.device_used_bytes == _approx(m_real.device_used_bytes)
    assert m_mid.required_bytes == _approx(m_real.required_bytes)
    assert m_mid.peak_allocated_bytes == _approx(m_real.peak_allocated_bytes)
    t_mid, t_real = estimate_step_time(mid, accel, jb), estimate_step_time(real, accel, jb)
    assert t_mid.step_time_s == _approx(t_real.step_time_s)
    for part, s in t_real.breakdown_s.items():
        assert t_mid.breakdown_s[part] == _approx(s, abs=1e-6 * t_real.step_time_s), part
