"""Time and memory of generating completions: the rollout phase of GRPO/PPO, `--task generate`.

B = prompts x generations_per_prompt sequences, prompt length P, completion length C. The prefill
forward runs the B x P prompt tokens and yields completion token 1; decode steps at contexts
t = P .. P + C - 2 yield tokens 2..C (C - 1 forwards of one token per sequence; HF generate's loop,
transformers generation/utils.py `_sample`). Every forward is traced on fake tensors
(trace/generate.py) and timed by the training time model (timing.op_times: roofline per op with
the catalog's bandwidth and peaks, measured efficiencies; no new fitted factor).

Decode step at context t (Pope et al. 2022, arXiv:2211.05102, sec. 3.3): every step reads all
weights once and the whole KV cache, B x t x 2 x layers x kv_heads x head_dim elements, and does
2 x params x B + O(B t) attention FLOPs: T(t) is affine in t. It is traced at t0 = P and
t1 = P + C - 2 and summed in closed form over the n = C - 1 steps,

    sum_{i=0}^{n-1} T(t0 + i) = n T(t0) + (T(t1) - T(t0)) (n - 1) / 2.

One step's time:
  engine "hf"   eager PyTorch: the forward's kernels through the host/device queue
                (predict/host.py), each issued at the no-grad forward's host cost
                (`host_inference_s`, data/efficiency.json); HF generate syncs every step
                (stopping criteria on the sampled tokens), so steps do not overlap.
  engine "vllm" device time only: CUDA graphs replay a decode step with one launch, and vLLM's
                scheduler/sampler CPU work per step is not modelled (0 s; an optimistic bound).
                The trace is of HF's unfused ops, so the device time is pessimistic for vLLM's
                fused kernels. The context's part is in closed form: vLLM's paged attention
                reads the cached K/V once per step, where HF's eager path also expands it to
                every query head (repeat_kv) and re-concatenates the cache, which at 32k tokens
                moved 4x the physical bytes (validation/results/generation_validation.md); so a
                vLLM step is the step traced at context 1 plus kv_cache_bytes(B x t) / (bandwidth
                x bw_eff). vLLM prefills each prompt once and shares its KV blocks among its
                n samples (SamplingParams n; prefix sharing).
  weight gather with weights sharded over N devices (ZeRO-3 with TRL's
                `ds3_gather_for_generation=False`, or FSDP) and engine "hf": every forward
                all-gathers the (N-1)/N of the weights a device lacks, in the compute dtype
                (comm.collective_s, ring all-gather over the catalog's interconnect). Prefetch
                overlaps it with compute unit by unit, so a step takes max(compute, gather) plus
                the first unit's gather (as comm.py's FSDP model; unit = weights / layers).
                TRL's default `ds3_gather_for_generation=True` gathers once instead
                (huggingface/trl@006d32c9 trl/trainer/grpo_config.py, GRPOConfig docstring):
                `gather_once=True`.
Memory: weights (sharded: 1/N plus two gathered units) + the KV cache of B x (P + C) tokens in
the compute dtype (closed form `kv_cache_bytes`, checked against the traced cache) + the largest
forward's transient. vLLM reserves `gpu_memory_utilization` x device memory up front whatever
it needs (0.9 standalone, vllm EngineArgs; TRL colocate default 0.3, grpo_config.py above).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import TrainplanError
from ..trace.derive import forwards
from ..trace.facts import InferenceTrace, kv_cache_bytes
from .comm import collective_s
from .target import semantics_for
from .host import issue_times, run_queue
from .optable import summarize
from .time_params import TimeParams, bundled
from .timing import op_times

ENGINES = ("hf", "vllm")
VLLM_MEMORY_UTILIZATION = 0.9        # vLLM EngineArgs.gpu_memory_utilization default
TRL_COLOCATE_MEMORY_UTILIZATION = 0.3  # TRL GRPOConfig.vllm_gpu_memory_utilization default


@dataclass
class StepCost:
    """One forward's time split: device (compute- / memory-bound ops), host dispatch, gather."""

    compute_s: float
    memory_s: float
    host_s: float
    gather_s: float             # all-gather of the weights a device lacks (0 unsharded)
    gather_first_s: float       # ...of the first unit, which nothing hides
    ops: int
    queued_s: float = 0.0       # eager: the kernels through the host/device queue (host.py)

    @property
    def device_s(self) -> float:
        return self.compute_s + self.memory_s

    def time(self, engine: str) -> float:
        t = max(self.device_s, self.queued_s) if engine == "hf" else self.device_s
        return t if not self.gather_s else max(t, self.gather_s) + self.gather_first_s


@dataclass
class GenerationEstimate:
    sequences: int
    prompt_len: int
    completion_len: int
    engine: str
    prefill_s: float
    decode_s: float
    total_s: float
    tokens_per_s: float            # completion tokens per second, all sequences
    per_token_s_first: float       # one decode step at context P
    per_token_s_last: float        # one decode step at context P + C - 2
    kv_cache_bytes: int            # B x (P + C) tokens
    weight_bytes: int              # resident on one device
    transient_bytes: int
    peak_bytes: int
    bound: str
    steps: dict[str, StepCost] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def step_cost(tr: InferenceTrace, accel, precision, p: TimeParams,
              gather: tuple[float, float] = (0.0, 0.0), host_speed: float = 1.0) -> StepCost:
    """Time one traced forward with the training time model (timing.op_times); `host_speed`:
    the host CPU's single-thread speed over the reference host's (predict/host.py)."""
    table = summarize(tr)
    t, cbound = op_times(table, accel, precision, p)
    td = t * table.count
    ops = int(np.sum(table.count))
    q = run_queue(issue_times(table, p, host_speed, inference=True), t[table.seq])
    return StepCost(float(np.sum(td[cbound])), float(np.sum(td[~cbound])), q.host_s,
                    gather[0], gather[1], ops, q.seconds)


def estimate_generation(job, accel, *, prompts: int, generations_per_prompt: int = 1,
                        prompt_len: int, completion_len: int, engine: str = "hf",
                        sharded_weights_devices: int = 1, gather_once: bool = False,
                        gpu_memory_utilization: float | None = None,
                        calibration: TimeParams | None = None,
                        host_speed: float = 1.0, kernels: dict | None = None
                        ) -> GenerationEstimate:
    """Seconds and bytes to generate `completion_len` tokens for each of prompts x
    generations_per_prompt sequences on one `accel` device (module docstring); `host_speed`:
    the host CPU's single-thread speed over the reference host's (a platform's: host_cpus.csv);
    `kernels`: KernelSemantics fields a run on older releases set (a validation's published
    runs), over what the installed stack does on `accel`."""
    if engine not in ENGINES:
        raise TrainplanError(f"engine {engine!r} is not known.", allowed=", ".join(ENGINES))
    if min(prompts, generations_per_prompt, prompt_len, completion_len,
           sharded_weights_devices) < 1:
        raise TrainplanError("prompts, generations, lengths and devices must be >= 1.")
    p = calibration or bundled()
    notes: list[str] = []
    if engine == "vllm" and job.precision.amp:
        job = job.with_(precision="bf16" if job.precision.is_bf16 else "fp16")
        notes.append("vLLM holds its own weights in the half dtype, not the fp32 master weights")
    sem = replace(semantics_for(job, accel), **(kernels or {}))
    n_dev = sharded_weights_devices
    B, P, C = prompts * generations_per_prompt, prompt_len, completion_len
    prefill_batch = prompts if engine == "vllm" else B
    n = C - 1
    t0, t1 = P, P + max(C - 2, 0)
    if engine == "vllm":      # the context's part in closed form (module docstring): trace at 1
        t0 = t1 = 1
    decode = [(B, 1, t0)] + ([(B, 1, t1)] if t1 != t0 else []) if n else []
    pre, *steps = forwards(job, sem, [(prefill_batch, P, 0)] + decode)
    d0 = steps[0] if n else None
    d1 = steps[-1] if n else None

    sharded = n_dev > 1 and engine == "hf"
    gather, per_device_w = _gather(pre, job, accel, n_dev, gather_once, notes) if sharded else \
        ((0.0, 0.0), pre.weight_bytes)
    costs = {"prefill": step_cost(pre, accel, job.precision, p, gather, host_speed)}
    if n:
        costs["decode_first"] = step_cost(d0, accel, job.precision, p, gather, host_speed)
        costs["decode_last"] = step_cost(d1, accel, job.precision, p, gather, host_speed)
    prefill_s = costs["prefill"].time(engine)
    if gather_once and sharded:
        prefill_s += collective_s("all_gather", pre.params_total * job.precision.compute_bytes,
                                  n_dev, accel)
    T0 = costs["decode_first"].time(engine) if n else 0.0
    T1 = costs["decode_last"].time(engine) if n else 0.0
    if engine == "vllm" and n:
        # paged attention reads each sequence's cached K/V once per step: B x t tokens' bytes at
        # the measured bandwidth fraction, on top of the step traced at context 1
        per_token = kv_cache_bytes(pre.layers, pre.kv_heads, pre.head_dim, B,
                                   pre.kv_dtype_bytes) / (accel.memory_bandwidth_bytes_per_s
                                                          * p.bw_eff)
        first, last = P, P + max(C - 2, 0)
        T0, T1 = T0 + per_token * first, T0 + per_token * last
        notes.append("vLLM decode: the step traced at context 1 plus one read of the KV cache "
                     "per step (paged attention; HF's repeat_kv and cache concatenation, which "
                     "the eager trace has, are not run)")
    decode_s = n * T0 + (T1 - T0) * (n - 1) / 2 if n else 0.0
    total = prefill_s + decode_s

    kv, transient, peak = _memory(pre, d0, d1, B * (P + C), per_device_w, engine, accel,
                                  gpu_memory_utilization, notes)
    bound = _bound(costs, engine, n)
    notes.append(f"{len(costs)} forwards traced; decode time affine in context, summed in "
                 f"closed form over {n} steps; bound: {bound}")
    for tr in (pre, d0):
        if tr is not None:
            notes.extend(x for x in tr.notes if x not in notes)
    return GenerationEstimate(B, P, C, engine, prefill_s, decode_s, total,
                              B * C / total if total else 0.0, T0, T1, kv, per_device_w,
                              transient, peak, bound, costs, notes)


def _gather(pre: InferenceTrace, job, accel, n_dev: int, gather_once: bool, notes: list[str]
            ) -> tuple[tuple[float, float], int]:
    """((all-gather of the weights a device lacks each forward, of the first unit), weight
    bytes a device holds) with the weights sharded over `n_dev` devices (module docstring)."""
    w_compute = pre.params_total * job.precision.compute_bytes
    unit = w_compute / max(pre.layers, 1)
    if gather_once:
        notes.append(f"weights gathered once for generation (TRL ds3_gather_for_generation): "
                     f"{collective_s('all_gather', w_compute, n_dev, accel):.3g} s, "
                     "full weights resident")
        return (0.0, 0.0), pre.weight_bytes
    gather = (collective_s("all_gather", w_compute, n_dev, accel),
              collective_s("all_gather", unit, n_dev, accel))
    notes.append(f"weights sharded over {n_dev} devices: every forward (each decode "
                 f"token) all-gathers {(n_dev - 1) / n_dev:.0%} of the weights over "
                 f"{accel.interconnect} ({gather[0]:.3g} s per step)")
    return gather, int(pre.weight_bytes / n_dev + 2 * unit)


def _memory(pre: InferenceTrace, d0, d1, tokens: int, weights: int, engine: str, accel,
            gpu_memory_utilization: float | None, notes: list[str]) -> tuple[int, int, int]:
    """(KV cache of `tokens` tokens, the largest forward's transient, peak bytes) on one
    device: the closed-form cache (scaled by the traced one's ratio where layers share or
    window it), and vLLM's reservation (module docstring)."""
    kv = kv_cache_bytes(pre.layers, pre.kv_heads, pre.head_dim, tokens, pre.kv_dtype_bytes)
    last = d1 or pre
    traced_tokens = last.batch_size * (last.context + last.new_tokens)
    closed = kv_cache_bytes(last.layers, last.kv_heads, last.head_dim, traced_tokens,
                            last.kv_dtype_bytes)
    if last.kv_cache_bytes != closed:
        notes.append(f"the traced cache holds {last.kv_cache_bytes} B, the closed form "
                     f"{closed} B (sliding-window or shared-KV layers): traced ratio applied")
        kv = int(kv * last.kv_cache_bytes / closed)
    transient = max(tr.transient_bytes for tr in (pre, d0, d1) if tr is not None)
    need = weights + kv + transient
    peak = need
    if engine == "vllm":
        util = gpu_memory_utilization or VLLM_MEMORY_UTILIZATION
        peak = max(need, int(util * accel.usable_memory_bytes))
        notes.append(f"vLLM reserves gpu_memory_utilization {util:g} x device memory up front "
                     f"(default {VLLM_MEMORY_UTILIZATION} standalone, "
                     f"{TRL_COLOCATE_MEMORY_UTILIZATION} in TRL colocate mode)")
        if need > util * accel.usable_memory_bytes:
            notes.append("weights + KV cache exceed that reservation: vLLM preempts sequences "
                         "or refuses to start")
    return kv, transient, peak


def calibrated(g: GenerationEstimate, factor, key: str) -> GenerationEstimate:
    """`g` with its times scaled by the user's generation measurements of the accelerator
    (measure/calibrate.py: a "<accelerator>:generate" factor, measured / predicted generate
    call), said in its notes; `g` itself without one."""
    if factor is None:
        return g
    k = factor.step_time_factor
    return replace(g, prefill_s=g.prefill_s * k, decode_s=g.decode_s * k, total_s=g.total_s * k,
                   tokens_per_s=g.tokens_per_s / k, per_token_s_first=g.per_token_s_first * k,
                   per_token_s_last=g.per_token_s_last * k,
                   notes=g.notes + [f"times calibrated on {factor.measurements} of your "
                                    f"generation measurements ({key}: x{k:.3g})"])


def _bound(costs: dict[str, StepCost], engine: str, n: int) -> str:
    """What the total time is spent waiting on, steps weighted as they occur (decode: n x)."""
    w = {"prefill": 1.0, "decode_first": n / 2, "decode_last": n / 2}
    tally = {"compute": 0.0, "memory bandwidth": 0.0, "kernel launches (host)": 0.0,
             "weight gather": 0.0}
    for k, c in costs.items():
        t = c.time(engine)
        if c.gather_s and c.gather_s >= max(c.device_s, c.host_s if engine == "hf" else 0):
            tally["weight gather"] += w[k] * t
        elif engine == "hf" and c.host_s > c.device_s:
            tally["kernel launches (host)"] += w[k] * t
        elif c.compute_s >= c.memory_s:
            tally["compute"] += w[k] * t
        else:
            tally["memory bandwidth"] += w[k] * t
    return max(tally, key=tally.get)
