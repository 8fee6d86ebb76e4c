"""One job on one accelerator: the single path from a job to memory, step time and findings, and
the single search for the largest micro-batch that fits. `estimate`, `plan`, its fix ladder and
its reports all come through here.

    evaluate(job, accel, calibration, traces)  -> Evaluation
    largest_micro_batch(job, accel, traces, limit) -> int | None

The largest micro-batch. Whether micro-batch b fits is decided on `MemoryEstimate.required_bytes`
(memory.py), on the trace `Traces.at` gives for b: real at 1 and at the anchors 2 and 32, every
other b read off the line through the anchors, which equals a real trace (trace/derive/). The
search starts where the line through the anchors' memory crosses the capacity, gallops from
there to a micro-batch that fits and one that does not, and finds the crossing between them
(regula falsi); memory is non-decreasing in b, so the path does not change the answer. Every
evaluation of every job reads the same traces, never the batch the user asked about, so the
answer is the same however the question was asked (tests/test_predict_properties.py), and
`estimate` and `plan` agree (tests/test_estimate_plan_agree.py). A model whose op sequence changes with the batch cannot be
read off a line: there every probe is a real trace.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..accelerators import Accelerator
from ..trace.derive import Deferred, Traces, anchors, anchors_for, fragmentation, rules_for
from ..trace.facts import Trace
from ..units import fmt_gib
from . import algorithms, compat
from .calibration import BUNDLED_ONLY, Calibration
from .findings import Finding
from .memory import FITS, NO_FIT, TIGHT, MemoryEstimate, estimate_memory, fragmentation_between
from .sharding import holds_full_gradients
from .target import devices, semantics_for
from .timing import StepTime, estimate_step_time

MAX_MICRO_BATCH = 65536    # the search's ceiling: beyond it the answer is this bound


@dataclass(frozen=True)
class Evaluation:
    """A job at its micro-batch on `devices` devices of `accel`."""

    job: object
    accel: Accelerator
    devices: int
    trace: Trace
    interpolated: bool                # the trace lies between two traced micro-batches
    memory: MemoryEstimate
    time: StepTime
    findings: tuple[Finding, ...]
    calibration: dict                 # what the step time rests on (Calibration.source)
    phases_s: dict | None = None      # post-training algorithms: seconds per step by phase
    generation: object | None = None  # their generation estimate (generation.py)

    @property
    def step_phases_s(self) -> dict[str, float]:
        """Seconds per optimizer step by phase (algorithms.PHASES); they sum to the step time.
        Supervised training is all `training`."""
        if self.phases_s is not None:
            return dict(self.phases_s)
        return {**dict.fromkeys(algorithms.PHASES, 0.0), "training": self.time.step_time_s}

    @property
    def fits(self) -> bool:
        """The device holds the step and nothing else stops the job here."""
        return self.memory.fits and not any(f.severity == "error" for f in self.findings)

    @property
    def tight(self) -> bool:
        """Fits on paper, but within the verdict's band of the capacity (memory.py)."""
        return self.fits and self.memory.tight

    @property
    def fit_state(self) -> str:
        """fits / tight / does not fit (memory.py), "does not fit" where a finding stops it."""
        return self.memory.fit_state if self.fits else NO_FIT

    @property
    def blocked(self) -> bool:
        """An error that no micro-batch can cure (the target cannot run the job as written)."""
        return any(f.blocks for f in self.findings)


def memory_finding(mem: MemoryEstimate, accel: Accelerator, job) -> Finding:
    """The device is too small; under FSDP with accumulation and no_sync the first thing to
    try is syncing each micro-batch (it holds every full gradient: sharding.py)."""
    first = ("sync_each_batch: true (FSDP then holds gradient shards, not every full gradient "
             "across the micro-batches), " if holds_full_gradients(job) else "")
    return Finding("error", f"needs {fmt_gib(mem.required_bytes)} per device, {accel.id} has "
                            f"{fmt_gib(mem.capacity_bytes)}",
                   first + "a smaller micro-batch with accumulation, or `trainplan plan` for the "
                   "fix ladder (checkpointing, LoRA, ZeRO, offload)", kind="memory")


def tight_finding(mem: MemoryEstimate, accel: Accelerator) -> Finding:
    held = (f"the allocator must give cached memory back to run it ({fmt_gib(mem.held_bytes)} "
            f"with room)" if mem.fit_margin < 0 else
            f"{mem.fit_margin:.0%} of it free")
    band = (f"; with the band (+{mem.band.p95:.1%}, {mem.band.basis}, {mem.band.rows} "
            f"validated runs) it needs {fmt_gib(mem.banded_bytes)}, fitting "
            f"{mem.fit_probability:.0%} of them" if mem.band is not None else "")
    return Finding("warning", f"tight: fits {accel.id}'s {fmt_gib(mem.capacity_bytes)} on "
                              f"paper, with {held}{band}; prone to out-of-memory errors",
                   "for headroom: a smaller micro-batch with more accumulation, activation "
                   "checkpointing, or `trainplan plan` for the fix ladder", kind="memory")


def memory_at(job, accel: Accelerator, traces: Traces, sem, batch: int
              ) -> tuple[Trace, bool, MemoryEstimate]:
    """(trace, interpolated?, memory) of `job` at micro-batch `batch`, with the allocator's
    fragmentation read off the line through the anchors' replays (memory.fragmentation_between),
    so memory is non-decreasing in the micro-batch."""
    tr, interpolated = traces.at(job, sem, batch)
    lo, hi = anchors(job)
    # the backend's allocator, as the job configures it (trace/derive/allocator.py)
    rules = rules_for(accel.backend, job.expandable_segments)
    if batch <= lo:        # the line starts at lo: the larger anchor is not needed (nor traced)
        frag = fragmentation(traces.exact(job, sem, lo), rules)
    else:
        frag = fragmentation_between(fragmentation(traces.exact(job, sem, lo), rules),
                                     fragmentation(traces.exact(job, sem, hi), rules), lo, hi,
                                     batch)
    mem = estimate_memory(tr, accel, job.with_(batch_size=batch), frag=frag)
    if job.algorithm != "sft":   # a reference copy, PPO's models, vLLM's share stay resident
        mem = algorithms.with_resident(mem, job, tr, accel, devices(job, accel))
    return tr, interpolated, mem


def step_memory(job, accel: Accelerator, traces: Traces
                ) -> tuple[bool, MemoryEstimate] | None:
    """(interpolated?, memory) as `evaluate(job, accel, ..., traces=traces)` reports them,
    without the step time it also predicts (most of its cost: the op table and the host queue
    over every op), or None where the memory rests on that time: an algorithm with phases (a
    rollout: what stays resident while it generates, predict/algorithms.py `step`). A training
    step's memory is `memory_at`'s at the job's micro-batch, as in `evaluate`; the findings
    change no byte."""
    if job.algorithm != "sft":
        return None
    _tr, interpolated, mem = _at_batch(job, accel, traces, semantics_for(job, accel))
    return interpolated, mem


def _at_batch(job, accel: Accelerator, traces: Traces, sem) -> tuple[Trace, bool, MemoryEstimate]:
    """`memory_at` the job's micro-batch, with what it reads asked for first (in rounds, on all
    cores: derive/rounds.py)."""
    traces.prefetch([(job, sem, b) for b in anchors_for(job, job.batch_size)])
    return memory_at(job, accel, traces, sem, job.batch_size)


def evaluate(job, accel: Accelerator, calibration: Calibration = BUNDLED_ONLY,
             traces: Traces | None = None, cpu_cores: int | None = None,
             strict: bool = True, host_speed: float = 1.0) -> Evaluation:
    """`job` at `job.batch_size` on `job.gpus` units of `accel`. `strict`: what the target cannot
    run at all raises TrainplanError (compat.py); the planner adapts the job first and passes
    False. `cpu_cores`: the host's, caps DataLoader workers (timing.input_pipeline);
    `host_speed`: its CPU's single-thread speed over the reference host's (predict/host.py)."""
    traces = traces or Traces()
    findings = compat.check(job, accel, strict=strict)
    sem = semantics_for(job, accel)
    try:
        tr, interpolated, mem = _at_batch(job, accel, traces, sem)
    except Deferred:      # in rounds: the rollout's forwards are made in the same round
        algorithms.request_rollout(job, accel, devices(job, accel))
        raise
    time = calibration.apply(estimate_step_time(tr, accel, job, calibration.params,
                                                cpu_cores=cpu_cores, host_speed=host_speed),
                             accel.id)
    phases = generation = None
    if job.algorithm != "sft":
        alg = algorithms.step(job, accel, tr, mem, time, devices(job, accel), resident_in=True,
                              host_speed=host_speed)
        phases, generation, mem = alg.phases_s, alg.generation, alg.memory
        time = with_phases(time, phases, alg.notes)
    findings = compat.with_gpu0(findings, mem.gpu0_extra_bytes)
    if job.expert_parallel > 1 and not tr.expert_param_bytes:
        findings.append(Finding("warning", f"expert parallelism ({job.expert_parallel}) asked, "
                                           "but the model has no mixture-of-experts layers",
                                "drop --expert-parallel", kind="strategy"))
    if job.moe_capacity_factor is not None and not tr.expert_param_bytes:
        findings.append(Finding("warning", f"an expert capacity factor "
                                           f"({job.moe_capacity_factor:g}) given, but the model "
                                           "has no mixture-of-experts layers to route",
                                "drop --moe-capacity-factor", kind="strategy"))
    if not mem.fits:
        findings.append(memory_finding(mem, accel, job))
    elif mem.tight:
        findings.append(tight_finding(mem, accel))
    return Evaluation(job, accel, devices(job, accel), tr, interpolated, mem, time,
                      tuple(findings),
                      calibration.source(accel.id, fp32=job.precision.compute == "fp32"),
                      phases, generation)


def expandable_advice(ev: Evaluation, traces: Traces) -> Finding | None:
    """Where a job is TIGHT or does not fit on a CUDA GPU and the caching allocator's cache is
    part of why: the same step under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch's
    own out-of-memory message suggests it "if reserved but unallocated memory is large"), replayed
    (trace/derive/expandable.py), where that moves the verdict (does not fit -> tight or fits,
    tight -> fits). None otherwise."""
    job, accel, mem = ev.job, ev.accel, ev.memory
    if ev.fit_state == FITS or job.expandable_segments or ev.blocked or job.algorithm != "sft" \
            or not rules_for(accel.backend, True).expandable:
        return None
    alt = memory_at(job.with_(expandable_segments=True), accel, traces,
                    semantics_for(job, accel), job.batch_size)[2]
    rank = {NO_FIT: 0, TIGHT: 1, FITS: 2}
    if rank[alt.fit_state] <= rank[ev.fit_state]:
        return None
    state = {FITS: "fits", TIGHT: "fits on paper (tight)"}[alt.fit_state]
    return Finding("info", f"with expandable allocator segments it holds "
                           f"{fmt_gib(alt.held_bytes)} instead of {fmt_gib(mem.held_bytes)} and "
                           f"runs in {fmt_gib(alt.required_bytes)} (the allocator caches less): "
                           f"it {state}",
                   "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before launching; "
                   "plan it with --expandable-segments", kind="advice")


def with_phases(time, phases: dict, notes) -> object:
    """The step time of the whole algorithm step: the phases' sum, rates scaled to it."""
    total = sum(phases.values())
    f = time.step_time_s / total if total else 1.0
    return replace(time, step_time_s=total, samples_per_s=time.samples_per_s * f,
                   tokens_per_s=time.tokens_per_s * f if time.tokens_per_s else None,
                   mfu=time.mfu * f if time.mfu else None,
                   notes=list(time.notes) + list(notes))


def largest_micro_batch(job, accel: Accelerator, traces: Traces,
                        limit: int = MAX_MICRO_BATCH, margin: bool = False) -> int | None:
    """The largest micro-batch b <= `limit` whose memory fits `accel` (None if 1 does not); see
    the module docstring. Other settings (accumulation, strategy, devices) are the job's.
    `margin`: the largest that is not tight (what the device holds, plus the verdict's band,
    fits: memory.py); held memory (never below required: pinned segments are reserved ones) is
    non-decreasing in b like required memory, and so is the band on it, so the same search
    applies."""
    sem = semantics_for(job, accel)
    cap = accel.usable_memory_bytes

    def need(b: int) -> int:
        m = memory_at(job, accel, traces, sem, b)[2]
        return max(m.banded_bytes, m.required_bytes) if margin else m.required_bytes

    lo, hi = anchors(job)
    if limit == 1 or need(lo) > cap:
        return 1 if need(1) <= cap else None
    r_lo, r_hi = need(lo), need(hi)
    # where the anchors' line crosses the capacity, then gallop from there to a bracket
    guess = limit if r_hi <= r_lo else lo + (cap - r_lo) * (hi - lo) // (r_hi - r_lo)
    b = max(lo, min(limit, guess))
    r, step = need(b), 1
    if r <= cap:
        good = (b, r)
        while good[0] < limit:
            b = min(limit, good[0] + step)
            r = need(b)
            if r > cap:
                return _last_fitting(need, cap, good, b, r)
            good, step = (b, r), step * 2
        return limit
    bad, r_bad = b, r
    while True:
        b = max(lo, bad - step)
        r = need(b)
        if r <= cap:
            return _last_fitting(need, cap, (b, r), bad, r_bad)
        bad, r_bad, step = b, r, step * 2


def _last_fitting(need, cap: int, good: tuple[int, int], bad: int, r_bad: int) -> int:
    """The largest b in [good, bad) with need(b) <= cap, given need at both ends. Memory is
    near-affine in between (the line between two anchors), so each step guesses where the line
    crosses the capacity and checks the guess and the micro-batch after it (regula falsi), with
    bisection as the fallback: two or three evaluations where bisection takes eight."""
    (lo, r_lo), hi, r_hi = good, bad, r_bad
    while hi - lo > 1:
        guess = lo + int((cap - r_lo) * (hi - lo) // max(1, r_hi - r_lo))
        for b in (guess, guess + 1) if lo < guess < hi - 1 else ((lo + hi) // 2,):
            r = need(b)
            if r <= cap:
                lo, r_lo = b, r
            else:
                hi, r_hi = b, r
                break
    return lo
