"""One optimizer step of a post-training algorithm (algorithm.py): its phases and its memory.

The traced step (forward, backward, optimizer on prompt + completion) is the `training` phase.
Around it, per optimizer step and device (TRL's defaults: one generation batch per optimizer
step, steps_per_generation = gradient accumulation steps, so each device generates the
S = batch_size x grad_accum completions it then trains on):

    generation  GRPO, PPO: prefill + decode of S sequences (generation.py). `hf`: model.generate
                in the training process; under ZeRO-3 with gather_for_generation (TRL's
                ds3_gather_for_generation, default true) the weights are all-gathered once per
                generation and held whole while it runs; without it, and under FSDP, every
                forward, so every generated token, gathers them. vLLM: the engine's own copy
                (colocated: a share of every device, held through training too), updated with
                the new weights once per step.
    reference   GRPO with beta > 0, DPO, PPO: a no-grad forward of the reference model over the
                step's sequences: one forward of the traced step per micro-batch. With LoRA the
                reference is the base with adapters disabled (no second copy of the weights),
                else a second copy, sharded as the policy's weights are.
    old_policy  GRPO with iterations > 1: the sampling policy's log-probs, one more forward.
    reward, value  PPO: the reward and value models' forwards (both the policy's architecture
                with a scalar head, as TRL's examples load them), and the value model trains
                beside the policy: its step is a second training step, and its weights,
                gradients and optimizer state sit on the device too.

Memory: the training peak plus what stays resident through it (reference copy, PPO's models,
vLLM's colocated share), against the generation peak: what training keeps between steps
(weights and optimizer state; gradients are freed by zero_grad) plus the weights gathered for
generation, the KV cache and the decode's transient. The larger decides the fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..accelerators import Accelerator
from ..algorithm import GENERATES
from .comm import collective_s
from .memory import MemoryEstimate

PHASES = ("generation", "reference", "old_policy", "reward", "value", "training")


@dataclass(frozen=True)
class AlgorithmStep:
    phases_s: dict[str, float]          # seconds per optimizer step, by phase (PHASES)
    memory: MemoryEstimate              # the whole step's memory per device
    generation: object | None           # generation.GenerationEstimate, for GRPO and PPO
    notes: tuple[str, ...]


def resident_bytes(job, trace, accel: Accelerator, devices: int) -> dict[str, int]:
    """What the algorithm keeps on each device through the training step, by what it is."""
    out: dict[str, int] = {}
    weights = trace.weight_bytes // job.strategy.weight_shards(devices)
    reference = job.algorithm == "dpo" or job.algorithm == "ppo" or (
        job.algorithm == "grpo" and job.rollout is not None and job.rollout.beta > 0)
    if reference and job.lora is None:
        out["reference_weights"] = weights
    if job.algorithm == "ppo":
        out["reward_weights"] = weights
        out["value_model"] = weights + (trace.gradient_bytes + trace.optimizer_state_bytes) // \
            job.strategy.optimizer_shards(devices)
    if job.rollout is not None and job.rollout.engine == "vllm-colocate":
        out["generation_engine"] = int(job.rollout.gpu_memory_utilization
                                       * accel.usable_memory_bytes)
    return out


def with_resident(mem: MemoryEstimate, job, trace, accel: Accelerator, devices: int
                  ) -> MemoryEstimate:
    """The training step's memory with what the algorithm keeps resident beside it."""
    return _memory(mem, resident_bytes(job, trace, accel, devices), 0)


def step(job, accel: Accelerator, trace, mem: MemoryEstimate, time, devices: int,
         generate=None, resident_in: bool = False, host_speed: float = 1.0) -> AlgorithmStep:
    """Phases and memory of one optimizer step (module docstring). `generate`: the generation
    model (generation.estimate_generation; a parameter so tests can pass another).
    `resident_in`: `mem` already holds the resident share (evaluate.memory_at adds it).
    `host_speed`: the host CPU's, for generation's host dispatch as for the training step's."""
    k = max(1, job.grad_accum)
    forward = time.forward_s * k                       # one forward per micro-batch
    phases = dict.fromkeys(PHASES, 0.0)
    phases["training"] = time.step_time_s
    notes: list[str] = []
    r = job.rollout
    if job.algorithm == "dpo" or job.algorithm == "ppo" or (r is not None and r.beta > 0):
        phases["reference"] = forward
    if job.algorithm == "grpo" and r.iterations > 1:
        phases["old_policy"] = forward
    if job.algorithm == "ppo":
        phases["reward"] = forward
        phases["value"] = forward
        phases["training"] = 2 * time.step_time_s
        notes.append("PPO: value and reward models as large as the policy (TRL's examples load "
                     "them from the same architecture)")
    resident = resident_bytes(job, trace, accel, devices)
    gen, gen_required = None, 0
    if job.algorithm in GENERATES:
        gen, phases["generation"], gen_required, more = _generation(job, accel, trace, mem,
                                                                    devices, generate,
                                                                    host_speed)
        notes += more
    memory = _memory(mem, {} if resident_in else resident, gen_required)
    return AlgorithmStep(phases, memory, gen, tuple(notes))


def _rollout(job, devices: int) -> dict:
    """The generation model's arguments for the job's rollout (each device generates what it
    trains on: micro-batch x accumulation sequences)."""
    r = job.rollout
    sharded = job.strategy.weight_shards(devices) if r.engine == "hf" else 1
    return dict(prompts=max(1, job.batch_size) * max(1, job.grad_accum), generations_per_prompt=1,
                prompt_len=r.prompt_len, completion_len=r.completion_len,
                engine="hf" if r.engine == "hf" else "vllm", sharded_weights_devices=sharded,
                gather_once=sharded > 1 and job.strategy.name.startswith("zero")
                and r.gather_for_generation,
                gpu_memory_utilization=r.gpu_memory_utilization
                if r.engine == "vllm-colocate" else None)


def request_rollout(job, accel: Accelerator, devices: int) -> None:
    """Ask for the rollout's traced forwards without waiting for them: called where the
    training step's traces are deferred (traces.in_rounds), so that one round makes both."""
    if job.algorithm not in GENERATES:
        return
    from ..errors import TrainplanError
    from .generation import estimate_generation
    from ..trace.derive import Deferred
    try:
        estimate_generation(job, accel, **_rollout(job, devices))
    except (Deferred, TrainplanError):    # an error is raised again where the step is evaluated
        pass


def _generation(job, accel, trace, mem, devices, generate, host_speed: float = 1.0):
    """(estimate, seconds per step, device bytes at the generation peak, notes)."""
    if generate is None:
        from .generation import estimate_generation as generate
    r, n = job.rollout, devices
    args = _rollout(job, n)
    seqs, sharded, once = args["prompts"], args["sharded_weights_devices"], args["gather_once"]
    est = generate(job, accel, host_speed=host_speed, **args)
    seconds = est.total_s
    notes = [f"generation: {seqs} sequences of {r.prompt_len} + {r.completion_len} tokens per "
             f"device and step ({r.engine}; bound by {est.bound})"]
    full = trace.params_total * job.precision.compute_bytes     # the whole model, 16-bit
    gathered = 0
    if once:
        gathered = full - full // sharded
        notes.append("ZeRO-3 gathers the whole model for generation once per step "
                     "(TRL's ds3_gather_for_generation) and holds it while generating")
    elif sharded > 1:
        gathered = max(0, est.weight_bytes - trace.weight_bytes // sharded)
        notes.append("the sharded weights are all-gathered for every generated token: on "
                     f"{accel.name} links this dominates generation")
    if r.engine != "hf":       # new weights to the engine once per step
        seconds += (collective_s("all_gather", full, 2, accel) if r.engine == "vllm-server"
                    else 2 * full / accel.memory_bandwidth_bytes_per_s)   # read + write
    b = mem.breakdown_bytes
    kept = b.get("weights", 0) + b.get("optimizer_states", 0) + b.get("framework_overhead", 0)
    if r.engine == "vllm-colocate":
        required = kept + int(r.gpu_memory_utilization * accel.usable_memory_bytes)
    elif r.engine == "vllm-server":
        required = 0
        notes.append("vllm-server: generation runs on a separate vLLM server's GPUs, not counted "
                     "in this platform's memory")
    else:
        required = kept + gathered + est.kv_cache_bytes + est.transient_bytes
    return est, seconds, required, notes


def _memory(mem: MemoryEstimate, resident: dict[str, int], gen_required: int) -> MemoryEstimate:
    """The step's memory: training plus what stays resident, or the generation peak."""
    extra = sum(resident.values())
    train_required = mem.required_bytes + extra
    if gen_required > train_required:
        b = dict(mem.breakdown_bytes, generation_peak=gen_required - mem.required_bytes)
        return replace(mem, required_bytes=gen_required, peak_phase="generation",
                       device_used_bytes=max(mem.device_used_bytes, gen_required),
                       held_bytes=max(mem.held_bytes, gen_required), breakdown_bytes=b)
    b = dict(mem.breakdown_bytes, **resident)
    return replace(mem, required_bytes=train_required,
                   device_used_bytes=mem.device_used_bytes + extra,
                   held_bytes=mem.held_bytes + extra,
                   peak_reserved_bytes=mem.peak_reserved_bytes + extra, breakdown_bytes=b)
