"""Traces one step serves for two targets: where two (job, semantics) pairs run the same step,
or one's step is read off the other's, one trace serves both.

* An fp16 job reads its bf16 twin's trace with the dtype renamed (`half_twin`, `relabel`): fp16
  and bf16 are both 2 bytes and autocast casts the same ops to either, so the two steps allocate
  the same bytes and run the same ops; only the dtype the kernels compute in differs, which the
  time model reads per op.
* A TPU's fp16 AMP step is its bf16 AMP step (`same_step`): XLA runs AMP in bf16.
* A step with gradient accumulation is read off the step without it (accumulate.py), exact,
  except under channels_last.
* A step with another optimizer's update (8-bit AdamW for AdamW, torch.optim's per-parameter
  loop for its multi-tensor step) is read off the step with one and the update made alone
  (swap.py, cache.py `_swapped`), exact where the two set the parameters up alike.
* Flash and memory-efficient attention share a trace where no SDPA call could take flash
  (`attention_twin`: a bias such as ALiBi, a padding mask, fp32, a CNN). That is known only once
  one of the two is traced (`Trace.flash_eligible`), so the cache traces the memory-efficient
  one first and the flash one only where the first took flash calls (schedule.py). Math
  attention shares the memory-efficient trace the same way where no call reached an attention
  kernel at all (`Trace.sdpa_calls`: a CNN, a model whose attention transformers runs eager,
  Gemma-2 on 5.2x): the semantics' attention is read nowhere else (emulation.py `backend`).

`canonical(job, sem)` applies the first three: the (job, semantics) whose real trace is made for
a request; the trace cache (cache.py) and its prefetching (schedule.py) both read it.
tests/test_trace_sharing.py and tests/test_depth.py check each against a trace of its own.
"""
from __future__ import annotations

import enum
import hashlib
from dataclasses import replace

from ..facts import Trace
from ..semantics import KernelSemantics
from .accumulate import derivable
from .interpolate import family_key


class Twin(enum.Enum):
    """How a request's trace is read off its twin's."""

    RELABEL = "relabel"        # fp16 off bf16: the dtype renamed (`relabel`)
    SAME = "same"              # the same step (`same_step`)


def half_twin(job, sem: KernelSemantics) -> tuple | None:
    """(the job in bf16, its semantics) for an fp16 job (AMP or pure), else None (module
    docstring)."""
    if sem.autocast_dtype == "float16" or (sem.autocast_dtype is None and job.precision.is_fp16):
        twin = job.with_(precision=job.precision.with_compute("bf16"))
        return twin, replace(sem, autocast_dtype="bfloat16" if sem.autocast_dtype else None)
    return None


def same_step(job, sem: KernelSemantics) -> tuple:
    """(job, sem) as traced: an fp16 AMP job whose target computes in bf16 (a TPU: XLA runs AMP
    in bf16, predict/target.py) runs the bf16 AMP job's step, ops, dtypes and all; it is traced
    as that job, so a plan traces it once for the TPU and for an fp16 GPU's bf16 twin."""
    if sem.autocast_dtype == "bfloat16" and job.precision.amp and job.precision.is_fp16:
        return job.with_(precision=job.precision.with_compute("bf16")), sem
    return job, sem


def twin(job, sem: KernelSemantics) -> tuple[Twin, object, KernelSemantics] | None:
    """The one rewrite that applies first to (job, sem): (how, the twin job, its semantics), or
    None where its own trace is made."""
    half = half_twin(job, sem)
    if half is not None:
        return (Twin.RELABEL,) + half
    canon = same_step(job, sem)[0]
    if canon is not job:
        return Twin.SAME, canon, sem
    return None


def canonical(job, sem: KernelSemantics) -> tuple[object, KernelSemantics]:
    """The (job, semantics) whose real trace a request of (job, sem) is read off: its twins
    (`twin`) followed, and gradient accumulation dropped where it is read off the step without
    it (accumulate.py)."""
    step = twin(job, sem)
    while step is not None:
        _how, job, sem = step
        step = twin(job, sem)
    if job.grad_accum > 1 and derivable(sem):
        job = job.with_(grad_accum=1)
    return job, sem


def attention_twin(sem: KernelSemantics) -> KernelSemantics | None:
    """The flash semantics' memory-efficient twin and back, and the math semantics'
    memory-efficient twin. Flash and efficient part only where an SDPA call can take flash (no
    mask, 16-bit, head dim <= 256: emulation.py `_sdpa`); a step with no such call (an attention
    bias such as ALiBi, a padding mask, fp32, no SDPA at all: CNNs) runs the same ops,
    allocations and FLOPs under either, and one trace serves both (`same_under`). Math parts
    from efficient wherever an attention call is made."""
    other = {"flash": "efficient", "efficient": "flash", "math": "efficient"}.get(sem.attention)
    return replace(sem, attention=other) if other else None


def same_under(tr: Trace, sem: KernelSemantics) -> bool:
    """Whether `tr`, traced under its attention twin's semantics (`attention_twin`), is the step
    under `sem` too: no call could take flash (flash and efficient), or no call reached an
    attention kernel (math and either)."""
    if "math" in (sem.attention, tr.semantics.attention):
        return tr.sdpa_calls == 0
    return tr.flash_eligible == 0


def hint_key(job, sem: KernelSemantics) -> tuple:
    """What the cache's flash hint is kept by (cache.py `_hint`): the model and what decides its
    SDPA calls' dtype."""
    return (job.model, job.precision.name, job.attention, sem.autocast_dtype,
            sem.channels_last)


def as_semantics(tr: Trace, sem: KernelSemantics) -> Trace:
    """`tr` under semantics `sem` (the same step: `attention_twin`)."""
    if tr.semantics == sem:
        return tr
    out = replace(tr, semantics=sem)
    out.derived.share_replays(tr.derived)
    out.derived.family = tr.derived.family       # the same ops and events
    return out


_DTYPE_TWIN = {"bfloat16": "float16", "torch.bfloat16": "torch.float16"}


def relabel(tr: Trace, sem: KernelSemantics) -> Trace:
    """The bf16 twin's trace as the fp16 job's: each op's dtype and the semantics renamed."""
    ops, made = [], {}
    for r in tr.ops:
        if r.dtype in _DTYPE_TWIN:
            if id(r) not in made:    # a record repeated (a stitched trace's blocks: the same
                made[id(r)] = r.copied(dtype=_DTYPE_TWIN[r.dtype])   # object) stays one object
            r = made[id(r)]
        ops.append(r)
    out = replace(tr, ops=ops, semantics=sem)
    out.derived.share_replays(tr.derived)
    out.derived.family = relabelled_family(tr)
    return out


def relabelled_family(tr: Trace) -> bytes:
    """The interpolation family (interpolate.py `family_key`) of `tr` relabelled: a digest of
    `tr`'s (made where the trace is made and stored with it), so that two anchors read off
    their bf16 twins compare as those do, equal where theirs are (the same renaming of the same
    ops), without unpickling the twins' op records (a warm Llama-3.2-1B plan over every
    platform made 96 such keys from the records: 0.45 s of it, profiled)."""
    return hashlib.blake2b(family_key(tr) + b"relabel:fp16", digest_size=16).digest()
