"""Which job a trace is of, and which micro-batches are traced.

A trace depends on the model, shapes, precision, optimizer (the step it runs), checkpointing,
LoRA/quantisation and on whether gradients are accumulated (with accumulation a second
micro-batch runs with gradients live), but not on the device count, strategy, offload,
accelerator memory or where a paged optimizer's states live: memory and timing apply those
afterwards. So the job a trace is of (`trace_job`) drops the fields that do not change the traced
step, names the optimizer by the step it runs and folds every grad_accum > 1 into 2 (the tracer
runs two micro-batches for any accumulation).

Real traces are made at micro-batch 1 and at two anchors, 2 and 32; every other micro-batch is
read off the line through the anchors (interpolate.py: every op's work and every allocation is
affine in the batch, and the phase peaks and the allocator are replayed on those sizes, so the
result equals a real trace; tests/test_predict_properties.py). Which micro-batches are traced
never depends on the batch asked about, so neither does any answer.
"""
from __future__ import annotations

import functools

from ...optimizer import traced_as
from ...strategy import SINGLE
from ..semantics import KernelSemantics

ANCHORS = (2, 32)      # the two real traces every micro-batch >= 2 is read from
PER_SAMPLE_ANCHORS = (2, 4)   # ...for models that loop over the samples' images (anchors())

# Job fields that do not change the traced step (applied after tracing, or planning-only).
_UNTRACED = dict(gpus=1, strategy=SINGLE, offload="none", gpu=None, platforms=(), steps=None,
                 epochs=None, dataset_size=None, target_batch=None, session_overhead_s=None,
                 num_workers=None, samples_per_s_per_worker=None, batch_size=1,
                 expert_parallel=1, rollout=None, campaign=None)


def trace_job(job):
    """The job as the tracer sees it: untraced fields reset, grad_accum folded to 1 or 2, of
    the algorithm only what changes the traced step (DPO's two sequences per sample), and the
    optimizer as the step it runs (a paged one's is its unpaged twin's: optimizer.py
    `traced_as`)."""
    return job.with_(grad_accum=1 if job.grad_accum <= 1 else 2,
                     algorithm="dpo" if job.algorithm == "dpo" else "sft",
                     optimizer=traced_as(job.optimizer), **_UNTRACED)


def anchors(job) -> tuple[int, int]:
    """The anchors of `job`'s line. A model whose forward loops in Python over each sample's
    images (Qwen-VL's vision tower runs attention window by window, image by image) runs
    batch x images x windows ops: a trace at 32 costs 32 times one at 1. Its work and
    allocations are as affine in the batch as any model's, so any two anchors give the same
    line; only the allocator's fragmentation beyond the larger anchor is extrapolated from a
    shorter base (predict/memory.py `fragmentation_between`). Such jobs use (2, 4)."""
    return PER_SAMPLE_ANCHORS if loops_over_images(job) else ANCHORS


def anchors_for(job, batch: int) -> list[int]:
    """The real traces evaluating micro-batch `batch` reads (what to prefetch): the anchors,
    whose line gives the trace and the allocator's fragmentation (predict/evaluate.py
    `memory_at`), and 1 itself. Micro-batch 1 reads only the smaller anchor's fragmentation: the
    larger one is left until a search for the largest micro-batch asks for it (a 70B job on one
    GPU never does)."""
    pair = anchors(job)
    return [1, pair[0]] if batch == 1 else list(pair)


def loops_over_images(job) -> bool:
    """Whether the job's step loops in Python over each sample's images (`anchors`)."""
    return bool(job.image_size and job.images_per_sample != 0 and job.model.startswith("hf:")
                and _loops_over_images(job.model))


@functools.cache
def _loops_over_images(model: str) -> bool:
    """Vision-language models whose inputs carry images (models/hf_names.py QWEN_VL_TYPES)."""
    from ...models.hf_names import QWEN_VL_TYPES, load_config_dict
    try:
        return load_config_dict(model[3:])[0].get("model_type") in QWEN_VL_TYPES
    except Exception:          # the model build will say why
        return False


def describe(job, sem: KernelSemantics, batch: int) -> str:
    """The progress line for one trace."""
    return (f"tracing {job.model_label} (micro-batch {batch}, {sem.attention} attention, "
            f"{sem.autocast_dtype or 'no autocast'})")


def describe_forward(job, sem: KernelSemantics, batch: int, new_tokens: int, context: int) -> str:
    """The progress line for one generation forward."""
    what = f"prefill of {new_tokens} tokens" if not context else f"decode at context {context}"
    return f"tracing {job.model_label} generation ({batch} sequences, {what})"


def describe_update(job) -> str:
    """The progress line for one optimizer's update (cache.py `_part`)."""
    return f"tracing {job.model_label} {job.optimizer.label} update"
