"""`trainplan estimate`: one job on one accelerator, as the prediction core evaluates it (predict/),
with the largest micro-batch that fits, and its stable JSON form.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .accelerators import Accelerator
from .predict import BUNDLED_ONLY, Calibration, Evaluation, Traces, evaluate, largest_micro_batch
from .predict.evaluate import expandable_advice

SCHEMA_VERSION = "1.5"    # 1.1: per_device.required_bytes, findings[].kind, precision_label
                          # 1.2: fit, fit_margin, per_device.held_bytes, max_batch_size_with_margin
                          # 1.3: algorithm, step_phases_s, generation
                          # 1.4: fit_band, fit_probability, per_device.banded_bytes,
                          #      max_batch_size_with_band (= max_batch_size_with_margin, which
                          #      now means the band)
                          # 1.5: max_grad_norm


@dataclass(frozen=True)
class Estimate:
    evaluation: Evaluation
    max_batch_size: int | None        # largest micro-batch that fits (None: not searched / 1 fails)
    max_batch_size_with_margin: int | None = None   # largest that fits with the band (bands.py)

    @property
    def notes(self) -> list[str]:
        """What the numbers rest on: the trace's notes, then the step time's (CPU offload, the
        host CPU, the input pipeline, the algorithm's phases), each once."""
        time_notes = self.evaluation.time.notes if self.evaluation.time is not None else ()
        return list(dict.fromkeys([*self.evaluation.trace.notes, *time_notes]))

    def __getattr__(self, name):      # job, accel, trace, memory, time, findings, fits ...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.evaluation, name)


def estimate(job, accel: Accelerator, calibration: Calibration = BUNDLED_ONLY,
             traces: Traces | None = None, with_max_batch: bool = True,
             host_speed: float = 1.0) -> Estimate:
    """`job` on `accel`: evaluated at its micro-batch, and the largest micro-batch searched.
    `host_speed`: the host CPU's single-thread speed over the reference host's (1: the host the
    time model's fit stands for; a platform's is `platforms.host_cpu(id).speed`)."""
    traces = traces or Traces()
    ev = evaluate(job, accel, calibration, traces, host_speed=host_speed)
    advice = expandable_advice(ev, traces)
    if advice is not None:
        ev = replace(ev, findings=ev.findings + (advice,))
    if not with_max_batch:
        return Estimate(ev, None)
    return Estimate(ev, largest_micro_batch(job, accel, traces),
                    largest_micro_batch(job, accel, traces, margin=True))


def generation_json(g) -> dict | None:
    """A generation estimate's figures (predict/generation.py), None without generation."""
    if g is None:
        return None
    return {"prefill_s": g.prefill_s, "decode_s": g.decode_s, "total_s": g.total_s,
            "tokens_per_s": g.tokens_per_s, "kv_cache_bytes": g.kv_cache_bytes,
            "peak_bytes": g.peak_bytes, "per_token_s_first": g.per_token_s_first,
            "per_token_s_last": g.per_token_s_last, "bound": g.bound}


def to_json(est: Estimate) -> dict:
    """The estimate as stable JSON (the keys other tools rely on are checked by
    `tests/test_estimate_contract.py`)."""
    m, t, tr, job = est.memory, est.time, est.trace, est.job
    return {
        "schema_version": SCHEMA_VERSION,
        "model": tr.model,
        "accelerator": est.accel.id,
        "devices": est.devices,
        "strategy": job.strategy.name,
        "strategy_label": job.strategy.label,
        "expert_parallel": job.expert_parallel,
        "precision": job.precision.name,
        "precision_label": job.precision.label,
        "fits": est.fits,
        "fit": est.fit_state,
        "fit_margin": m.fit_margin,
        "fit_band": m.band.to_json() if m.band is not None else None,
        "fit_probability": m.fit_probability,
        "per_device": {
            "peak_allocated_bytes": m.peak_allocated_bytes,
            "peak_reserved_bytes": m.peak_reserved_bytes,
            "device_used_bytes": m.device_used_bytes,
            "required_bytes": m.required_bytes,
            "held_bytes": m.held_bytes,
            "banded_bytes": m.banded_bytes,
            "capacity_bytes": m.capacity_bytes,
            "headroom_bytes": m.headroom_bytes,
            "peak_phase": m.peak_phase,
            "breakdown_bytes": m.breakdown_bytes,
            "gpu0_extra_bytes": m.gpu0_extra_bytes,
            "allocator": m.allocator,
        },
        "host_ram_bytes": m.host_ram_bytes,
        "max_batch_size": est.max_batch_size,
        "max_batch_size_with_margin": est.max_batch_size_with_margin,
        "max_batch_size_with_band": est.max_batch_size_with_margin,
        "batch_size": job.batch_size,
        "grad_accum": job.grad_accum,
        "max_grad_norm": job.max_grad_norm,
        "params": {"total": tr.params_total, "trainable": tr.params_trainable},
        "flops_per_micro_batch": tr.flops_per_step,
        "kernel_semantics": {"attention": tr.semantics.attention,
                             "autocast_dtype": tr.semantics.autocast_dtype},
        "findings": [f.to_dict() for f in est.findings],
        "notes": est.notes,
        "step_time_s": t.step_time_s,
        "algorithm": job.algorithm,
        "step_phases_s": est.step_phases_s,
        "generation": generation_json(est.generation),
        "throughput": {"samples_per_s": t.samples_per_s, "tokens_per_s": t.tokens_per_s},
        "mfu": t.mfu,
        "step_breakdown_s": dict(t.breakdown_s),
        "bound": t.bound,
        "xla_compile_s": t.xla_compile_s,
        "calibration": getattr(t, "calibration", None),
        "calibration_source": est.calibration,
    }


def generation_to_json(job, accel: Accelerator, g) -> dict:
    """`estimate --task generate` as JSON: the generation estimate and whether it fits."""
    return {"schema_version": SCHEMA_VERSION, "task": "generate", "model": job.model_label,
            "accelerator": accel.id, "precision": job.precision.name,
            "sequences": g.sequences, "prompt_len": g.prompt_len,
            "completion_len": g.completion_len, "engine": g.engine,
            "fits": g.peak_bytes <= accel.usable_memory_bytes,
            "capacity_bytes": accel.usable_memory_bytes, "weight_bytes": g.weight_bytes,
            **generation_json(g), "notes": list(g.notes)}
