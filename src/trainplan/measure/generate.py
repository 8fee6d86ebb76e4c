"""`trainplan measure --task generate`: time Hugging Face `generate` of exactly the job trainplan
predicts with `estimate --task generate`, on the local device.

The model is built as `measure` builds it (runner.build_on_device: real weights on the device,
the job's precision: pure fp16/bf16 weights, or fp32 weights under autocast for AMP), put in eval
mode, and given `--batch-size` random prompts of `--prompt-len` tokens. Each timed run is one
`model.generate(..., max_new_tokens=C, min_new_tokens=C, do_sample=False)` (greedy: every
sequence generates exactly C tokens, the decode loop transformers runs in `_sample`, with its
per-step stopping check that synchronises the host), timed between device synchronisations, after
`--warmup` untimed runs. The prefill alone is timed the same way (one forward of the prompts with
`use_cache=True`), so a record splits prefill from decode:

    decode per token = (generate - prefill) / (C - 1)

which is what `estimate --task generate` predicts (predict/generation.py: prefill, then C - 1
decode steps). The record has the training record's fields (step_time_s = one generate call,
samples_per_s = sequences per second, tokens_per_s = generated tokens per second, peak memory)
plus prefill_s and decode_token_s, and `source` "measure-generate", which `trainplan calibrate`
fits apart from training steps (measure/calibrate.py).
"""
from __future__ import annotations

import shlex
import statistics
import sys
import time

import torch

from ..errors import TrainplanError
from ..spec import Job
from .device import synchronize
from .recorder import Recorder

SOURCE = "measure-generate"


def predict_generation(job: Job, accel_id: str, prompt_len: int, completion_len: int) -> dict:
    """trainplan's `estimate --task generate` for the job on `accel_id`, as record fields."""
    from ..accelerators import get_accelerator
    from ..predict.generation import estimate_generation
    accel = get_accelerator(accel_id)
    g = estimate_generation(job.with_(gpu=accel.id), accel, prompts=job.batch_size,
                            prompt_len=prompt_len, completion_len=completion_len, engine="hf")
    n = max(1, completion_len - 1)
    return {"accelerator": accel.id, "step_time_s": g.total_s, "device_step_time_s": g.total_s,
            "prefill_s": g.prefill_s, "decode_token_s": g.decode_s / n,
            "samples_per_s": job.batch_size / g.total_s, "tokens_per_s": g.tokens_per_s,
            "peak_allocated_bytes": g.peak_bytes, "peak_reserved_bytes": g.peak_bytes,
            "device_used_bytes": g.peak_bytes, "kv_cache_bytes": g.kv_cache_bytes,
            "bound": g.bound, "calibrated_step_time_s": None, "calibration": None}


def run_generation(job: Job, prompt_len: int, completion_len: int, steps: int = 5,
                   warmup: int = 2, device: str | None = None, accelerator: str | None = None,
                   out=None, command: str | None = None, progress=None,
                   write: bool = True) -> tuple[dict, object]:
    """Time `warmup + steps` generate calls and one prefill each; returns (record, path)."""
    from .runner import build_on_device, on_device, precision_switches
    if min(prompt_len, completion_len) < 1:
        raise TrainplanError("--prompt-len and --completion-len must be >= 1.")
    dev, info, acc, sem, say = on_device(job, steps, device, accelerator, progress)
    bundle, _ = build_on_device(job.with_(grad_checkpointing="none"), sem, dev)
    model = bundle.module
    if not hasattr(model, "generate"):
        raise TrainplanError(f"{bundle.name} has no `generate` (not a Hugging Face causal LM).",
                             fix="measure generation of an hf: causal language model")
    model.eval()
    vocab = int(getattr(model.config, "vocab_size", 32000))
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompts = torch.randint(1, vocab, (job.batch_size, prompt_len), generator=gen).to(dev)
    mask = torch.ones_like(prompts)
    amp = getattr(torch, job.precision.half) if job.precision.amp and job.precision.half \
        else None
    kw = dict(max_new_tokens=completion_len, min_new_tokens=completion_len, do_sample=False,
              pad_token_id=0, attention_mask=mask)

    def call(fn):
        with torch.no_grad(), torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            return fn()

    rec = Recorder(job, dev, warmup, tokens_per_sample=completion_len)
    prefill: list[float] = []
    with precision_switches(job, dev):
        say(f"running {warmup} warm-up + {steps} timed generate calls of {completion_len} "
            f"tokens")
        for i in range(warmup + steps):
            synchronize(dev)
            t0 = time.perf_counter()
            call(lambda: model(input_ids=prompts, attention_mask=mask, use_cache=True))
            synchronize(dev)
            if i >= warmup:
                prefill.append(time.perf_counter() - t0)
            if i == 0:
                rec.start()
            else:
                rec._t = time.perf_counter()       # the prefill run is not part of a step
            try:
                tokens = call(lambda: model.generate(prompts, **kw))
            except torch.OutOfMemoryError:
                raise TrainplanError(f"{job.model_label} ran out of device memory generating "
                                     f"{completion_len} tokens for {job.batch_size} "
                                     "sequences.", fix="lower --batch-size") from None
            if tokens.shape[1] - prompt_len != completion_len:
                raise TrainplanError(f"generate returned {tokens.shape[1] - prompt_len} new "
                                     f"tokens, not {completion_len}.")
            rec.step()
    prefill_s = statistics.median(prefill)      # as the generate calls' (recorder.py)
    del model, bundle
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    settings = {"steps": steps, "device": str(dev), "prompt_len": prompt_len,
                "completion_len": completion_len, "decoding": "greedy, min_new_tokens = "
                "max_new_tokens", "inputs": "random token ids, reused every call"}
    say("predicting the same generation with trainplan")
    return rec.finish(source=SOURCE, command=command or shlex.join(sys.argv),
                      accelerator=accelerator, settings=settings, out=out, write=write,
                      extra_measured=lambda m: _split(m, prefill_s, completion_len),
                      predictor=lambda a: predict_generation(job, a, prompt_len,
                                                             completion_len))


def _split(measured: dict, prefill_s: float, completion_len: int) -> dict:
    """The generate call's time split: prefill, and per decode token the rest."""
    n = max(1, completion_len - 1)
    return dict(measured, prefill_s=prefill_s,
                decode_token_s=max(0.0, measured["step_time_s"] - prefill_s) / n)
