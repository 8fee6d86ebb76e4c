"""Trace one training step on fake tensors: no GPU, no weights, about a second for a 7B model.

The model is built on the meta device, then every parameter and buffer is re-created as a fake
CPU tensor inside `FakeTensorMode` (fake *cuda* tensors cannot train on a CPU build: their
backward dispatches to CUDA kernels a CPU build does not have). The step runs under:

    FakeTensorMode  <-  StepCounter (aten ops: FLOPs, bytes, live memory)
                    <-  TargetSemantics (torch functions: autocast, dropout, attention kernel)
                    <-  ModuleTracker (which module runs)

The optimizer's state is created first by one step on zero gradients (the state is created lazily,
so the peak of a real run comes in step 2), then one forward + loss + backward + step is traced and
its ops kept for the time model. With gradient accumulation one extra micro-batch runs first, so
gradients are live during the measured forward, as in micro-batches 2..K of a real step.
"""
from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.module_tracker import ModuleTracker

from ..errors import TrainplanError
from ..models import ModelBundle, build_model
from ..models.custom import user_files
from ..models.lora import apply_lora
from . import fp8, moe, store
from . import blocks as block_tags
from .checkpointing import apply_checkpointing
from .counters import CATEGORIES, OpRecord, StepCounter, event_blocks
from .depth import Stack, cut
from .optimizers import build_optimizer
from .semantics import KernelSemantics, TargetSemantics



def stored_dtype(precision) -> torch.dtype:
    """The dtype parameters are stored in (fp32 under AMP: the master weights)."""
    return getattr(torch, precision.stored)


def autocast_dtype(precision) -> torch.dtype | None:
    """torch.autocast's dtype, None without AMP."""
    return getattr(torch, precision.autocast) if precision.autocast else None


def compute_dtype(precision) -> torch.dtype:
    """What the matmuls compute in: the 16-bit dtype of AMP or pure half, else fp32."""
    return getattr(torch, precision.half) if precision.half else torch.float32


class _Tracker(ModuleTracker):
    """ModuleTracker that registers no backward hooks while a checkpointed block is recomputed.

    ModuleTracker keeps a handle to a multi-grad hook on every module's inputs and outputs until
    it exits. For the backward's rerun of a checkpointed block those hooks sit on a graph nobody
    backpropagates through, and the handles keep that graph, with every tensor it saved, alive:
    each recomputed block then stayed live to the end of backward (BERT-large fp32 b1 s512 with
    full checkpointing: backward peak 7.05 GB instead of 5.37 GB). During the rerun only the
    module names are pushed and popped, for attribution.
    """

    recomputing = False

    def _fw_pre_hook(self, mod, input) -> None:
        if self.recomputing:
            return self._get_append_fn(self._get_mod_name(mod), False)()
        return super()._fw_pre_hook(mod, input)

    def _fw_post_hook(self, mod, input, output) -> None:
        if self.recomputing:
            return self._get_pop_fn(self._get_mod_name(mod), False)()
        return super()._fw_post_hook(mod, input, output)


@dataclass
class ModuleRow:
    name: str
    depth: int
    params: int
    trainable_params: int
    activation_bytes: int
    flops_forward: float
    flops_backward: float


@dataclass
class Trace:
    """Exact per-step facts of one job at one micro-batch size on one kernel semantics."""

    model: str
    kind: str
    batch_size: int
    seq_len: int | None
    image_size: int | None
    tokens_per_sample: int | None
    semantics: KernelSemantics
    params_total: int
    params_trainable: int
    weight_bytes: int                 # parameters + buffers as stored
    trainable_param_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int             # live at the end of forward, saved for backward
    weight_cast_bytes: int            # autocast's cached low-precision weight copies
    peak_allocated_bytes: int
    peak_phase: str
    peak_breakdown_bytes: dict[str, int]
    phase_peaks: dict[str, tuple[int, dict[str, int]]]   # phase -> (peak bytes, by category)
    largest_block_param_bytes: int    # the biggest checkpointable/shardable block's parameters
    flops: dict[str, dict[str, float]]        # phase -> family -> FLOPs (one micro-batch; opt once)
    bytes_moved: dict[str, dict[str, float]]  # phase -> family -> bytes read + written
    recompute_flops: float
    ops: list[OpRecord]
    modules: list[ModuleRow]
    timeline: list[tuple[str, int]]
    alloc_events: list[tuple[int, int]]
    memory_log: list[tuple]               # what phase_peaks is computed from (counters.py)
    checkpointed_blocks: list[str]
    lora_modules: list[str]
    trace_seconds: float
    notes: list[str] = field(default_factory=list)
    root_param_bytes: int = 0         # parameters outside the repeated blocks (FSDP's root unit)
    # the same two as FSDP all-gathers them: floating-point parameters in the compute dtype
    # (MixedPrecision's param_dtype), packed quantised weights as they are (0: not known)
    largest_block_gathered_bytes: int = 0
    root_gathered_bytes: int = 0
    # of weight_bytes: the non-floating part (packed 4-bit / 8-bit weights and their state) and
    # the elements of the floating part (tracer.py `dtype_split`)
    packed_weight_bytes: int = 0
    floating_weight_elements: int = 0
    expert_param_bytes: int = 0       # MoE experts' parameters as stored (trace/moe.py)
    expert_trainable_bytes: int = 0
    moe_dispatch_elements: int = 0    # T x k x hidden over MoE layers: one all-to-all's payload
    hidden_size: int = 0              # the model's hidden size where it has one (0: unknown)
    stack: Stack | None = None        # traced with its repeated blocks cut (trace/depth.py)
    flash_eligible: int = 0           # SDPA calls flash would take (semantics.py `_sdpa`)
    # a cut trace's block of the stack (-1: none) for each of `alloc_events` (trace/blocks.py)
    event_blocks: list[int] | None = None
    # a `py:` model's user code: each .py file loaded when the trace ended -> its SHA-256
    # (models/custom.py `user_files`); the store reads the trace back only while all are unchanged
    sources: dict[str, str] = field(default_factory=dict)
    # (memory log entries, allocation events) as the step's first forward and its optimizer
    # step begin, and each gradient made in the backward (tracer.py `_gradient_made`): what
    # predict/accumulate.py derives the step with gradient accumulation from
    marks: list[tuple[int, int]] = field(default_factory=list)
    gradients_made: list[tuple] = field(default_factory=list)
    # a cut trace's last block: what it adds to the totals above (tracer.py `_last_block`)
    last_block: dict[str, float] | None = None
    # values the prediction layer derives from this trace alone (its op table, the allocator
    # replay), memoised so that every accelerator and strategy reuses them; never compared
    derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def flops_per_step(self) -> float:
        """Forward + backward FLOPs of one micro-batch (recomputation included)."""
        return sum(self.flops["forward"].values()) + sum(self.flops["backward"].values())

    @property
    def model_flops(self) -> float:
        """Forward + backward FLOPs without recomputation: the numerator of MFU."""
        return self.flops_per_step - self.recompute_flops


def _materialise(model: torch.nn.Module, counter: StepCounter,
                 blocks: dict[int, int] | None = None) -> None:
    """Replace meta parameters/buffers by fake CPU tensors (memoised so tied weights stay tied);
    `blocks` (id(module) -> block, trace/blocks.py) tags each with its block of the cut stack."""
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        if blocks is not None:
            counter.block = blocks.get(id(mod), -1)
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                t = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                counter.track(t, "weights")
                memo[id(p)] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                t = torch.empty(b.shape, dtype=b.dtype, device="cpu")
                counter.track(t, "weights")
                memo[id(b)] = t
            mod._buffers[name] = memo[id(b)]
        for name, v in list(vars(mod).items()):  # plain tensor attributes (e.g. rotary caches)
            if isinstance(v, torch.Tensor) and v.device.type == "meta":
                if id(v) not in memo:
                    memo[id(v)] = torch.empty(v.shape, dtype=v.dtype, device="cpu")
                setattr(mod, name, memo[id(v)])
    counter.block = -1


def prepare_model(job, bundle: ModelBundle, semantics: KernelSemantics | None = None
                  ) -> tuple[list[str], list[str]]:
    """Precision, LoRA/QLoRA, frozen prefixes and checkpointing, applied on the meta model.
    `semantics`: the target's kernels (which bitsandbytes release: quantization.py)."""
    model = bundle.module
    # AMP keeps fp32 master weights whatever dtype the config was published in
    model.to(stored_dtype(job.precision))
    lora_names: list[str] = []
    if job.lora is not None:
        compute = compute_dtype(job.precision)
        adapter = stored_dtype(job.precision)
        with torch.device("meta"):
            lora_names = apply_lora(model, job.lora.rank, job.lora.alpha, job.lora.targets,
                                    job.lora.dropout, job.quantize, compute, adapter,
                                    old_bnb4=bool(semantics and semantics.bnb4_keeps_input))
    for prefix in job.frozen:
        hit = False
        for name, p in model.named_parameters():
            if name == prefix or name.startswith(prefix + "."):
                p.requires_grad_(False)
                hit = True
        if not hit:
            raise TrainplanError(f"frozen: {prefix!r} matches no parameter of {bundle.name}.",
                                 fix="run `trainplan inspect` to see parameter names")
    half_frozen(model, job)
    return lora_names, []


def half_frozen(model: torch.nn.Module, job) -> int:
    """Store frozen floating-point parameters in the 16-bit dtype as `job.frozen_half` says (under
    mixed precision only: elsewhere they are stored as the job computes). "embeddings": the
    input embeddings and the output head (TRL's `peft_module_casting_to_bf16`: norms stay fp32);
    "all": every frozen parameter (loaded with torch_dtype=bf16/fp16, never upcast). Returns the
    parameters cast (quantization.py has the sources)."""
    from ..models.lora import HEADS
    if job.frozen_half == "none" or not job.precision.amp:
        return 0
    half = compute_dtype(job.precision)
    cast = 0
    for name, m in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if job.frozen_half == "embeddings" and not (
                isinstance(m, torch.nn.Embedding) or (leaf in HEADS and hasattr(m, "weight"))):
            continue
        for p in m.parameters(recurse=False):
            if not p.requires_grad and p.is_floating_point() and p.dtype != half:
                p.data = p.data.to(half)
                cast += p.numel()
    return cast


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameters, tied weights once; quantised weights count as the
    parameters they encode (QLoRA reports the base model's count, as peft does)."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total + _packed_param_count(model), trainable


_traced = 0            # steps traced by this process since its last full collection
FULL_COLLECTION_EVERY = 16


def _collect_and_freeze() -> None:
    """Collect cyclic garbage, then freeze what is live, so that a step's phase-end collections
    scan only its own objects, not torch's ~350,000 (trace_step). What a trace froze stays
    frozen after it: the next trace's collection then scans only what was made since (the last
    step's objects), where unfreezing made it a full one, 0.23 s of a 0.9 s trace of
    Llama-3.2-1B cut to 4 blocks. What was live at a freeze and later became cyclic garbage is
    reclaimed by a full collection every FULL_COLLECTION_EVERY traces."""
    global _traced
    if _traced >= FULL_COLLECTION_EVERY:
        gc.unfreeze()
        _traced = 0
        gc.collect()
    elif _traced:   # else nothing is frozen: no earlier trace's garbage to free (a flag, not
        gc.collect()  # gc.get_freeze_count(), which walks the frozen list: 0.05 s a trace)
    _traced += 1
    gc.freeze()


def trace_step(job, semantics: KernelSemantics, batch_size: int | None = None,
               extra_mode=None, routing: moe.Routing | None = None,
               depth: int | None = None) -> Trace:
    """Trace one optimizer step of `job` at micro-batch `batch_size` (default job.batch_size).

    `extra_mode`, if given, is a dispatch mode entered inside the fake mode for the whole step
    (tests use PyTorch's MemTracker to cross-check the live-memory peak). `routing` is the MoE
    routing assumption (trace/moe.py), by default the job's. `depth`: trace only the first
    `depth` blocks of the model's repeated stack (trace/depth.py; the whole model where it has
    none); the trace's `stack` says so.
    """
    t0 = time.perf_counter()
    batch = batch_size or job.batch_size
    bundle = build_model(job, attention=semantics.attention)
    stack = cut(bundle.module, depth) if depth else None
    bundle.notes.extend(moe.configure(bundle.module, routing or moe.routing_for(job),
                                      moe.top_k_of(getattr(bundle.module, "config", None))))
    lora_names, _ = prepare_model(job, bundle, semantics)
    model = bundle.module
    model.train()
    counter = StepCounter()
    sem = TargetSemantics(semantics, on_weight_cast=lambda t: counter.track(t, "weight_casts"))
    if semantics.fp8:      # FP8 linears (trace/fp8.py); their FP8 weight copies are weight casts
        fp8.convert(model, semantics.fp8, semantics.fp8_transpose,
                    on_weight_cast=lambda t: counter.track(t, "weight_casts"))
    amp = semantics.autocast_dtype is not None

    @contextlib.contextmanager
    def recompute_context():
        """Backward's rerun of a checkpointed block: same kernels and autocast as its forward."""
        counter.recompute, prev = True, sem.autocast_enabled
        sem.autocast_enabled = amp
        tracker.recomputing = True
        active = sem in torch.overrides._get_current_function_mode_stack()
        try:
            with contextlib.nullcontext() if active else sem:
                yield
        finally:
            counter.recompute, sem.autocast_enabled = False, prev
            tracker.recomputing = False
            sem.clear_cast_cache()

    blocks = apply_checkpointing(model, job.grad_checkpointing, recompute_context,
                                 reentrant=job.reentrant_checkpointing)
    if semantics.channels_last:
        model.to(memory_format=torch.channels_last)
    tracker = _Tracker()
    counter.mt = tracker
    in_blocks = None
    if stack is not None:          # which block each event happens in (trace/blocks.py)
        cut_blocks = model.get_submodule(stack.path)
        in_blocks = block_tags.module_blocks(cut_blocks)
        block_tags.tag(counter, cut_blocks)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    gc.disable()  # cyclic garbage is collected at phase ends, so peaks do not depend on GC timing
    _collect_and_freeze()   # ...and those collections scan only the step's objects
    try:
        with fake, counter, (extra_mode if extra_mode is not None else contextlib.nullcontext()):
            _materialise(model, counter, in_blocks)
            params = [p for p in model.parameters() if p.requires_grad]
            if not params:
                raise TrainplanError(f"{bundle.name} has no trainable parameter in this job.",
                                     fix="unfreeze something, or add LoRA adapters")
            for p in params:
                p.register_post_accumulate_grad_hook(lambda p: _gradient_made(counter, p))
            opt = _warm_optimizer(job, params, counter, semantics.optimizer_foreach)
            activation_bytes, weight_cast_bytes, act_by_module = _forward_backward(
                job, bundle, batch, semantics, model, counter, tracker, sem)
            counter.phase = "optimizer"
            counter.marks.append(_mark(counter))
            opt.step()
            opt.zero_grad(set_to_none=True)
            grad_bytes = sum(p.numel() * p.element_size() for p in params)
            state_bytes = counter.by_cat["optimizer_states"]
            last_block = _last_block(cut_blocks[-1], counter) if stack is not None else None
            counter.closed = True   # the step's events end here, not when GC frees the model
    except TrainplanError:
        raise
    except Exception as e:  # an op the fake device cannot run
        raise _untraceable(bundle.name, e) from None
    finally:
        gc.enable()

    if sem.bias_grad_calls:
        bundle.notes.append(f"{sem.bias_grad_calls} attention calls a step take a float bias "
                            "that needs a gradient: PyTorch refuses flash and cuDNN for them and "
                            "runs the memory-efficient kernel, which writes the bias gradient "
                            "(b x heads x s x s) in backward")
    return _summarise(job, bundle, semantics, batch, counter, model, grad_bytes, state_bytes,
                      activation_bytes, weight_cast_bytes, act_by_module, blocks, lora_names,
                      time.perf_counter() - t0, stack, sem.flash_eligible, last_block)


def stored_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters (tied ones once) and buffers as stored."""
    uniq = {id(p): p for p in module.parameters()}.values()
    return sum(p.numel() * p.element_size() for p in uniq) + \
        sum(b.numel() * b.element_size() for b in module.buffers())


def dtype_split(module: torch.nn.Module) -> tuple[int, int]:
    """(bytes of the parameters and buffers that are not floating point: packed quantised
    weights and their quantisation state, which a dtype cast leaves alone; elements of the
    floating-point ones, which DeepSpeed's 16-bit engine casts: plan/fixes.py, sharding.py)."""
    tensors = list({id(p): p for p in module.parameters()}.values()) + list(module.buffers())
    packed = sum(t.numel() * t.element_size() for t in tensors if not t.is_floating_point())
    return packed, sum(t.numel() for t in tensors if t.is_floating_point())


def _last_block(block: torch.nn.Module, counter: StepCounter) -> dict[str, float]:
    """What the last block of a cut stack adds to the trace's totals (what one more alike block
    adds: predict/depth.py `extend`): its parameters, their bytes as stored, trainable, as
    gradients and as optimizer state, and the activations and autocast casts it left live at the
    end of the forward."""
    total, trainable = count_parameters(block)
    uniq = {id(p): p for p in block.parameters()}.values()
    live = counter.last_block_live
    trainable_bytes = sum(p.numel() * p.element_size() for p in uniq if p.requires_grad)
    packed, floating = dtype_split(block)
    return {"params_total": total, "params_trainable": trainable,
            "weight_bytes": stored_bytes(block), "trainable_param_bytes": trainable_bytes,
            "packed_weight_bytes": packed, "floating_weight_elements": floating,
            "gradient_bytes": trainable_bytes,
            "optimizer_state_bytes": counter.live_by_block("optimizer_states", counter.last_block),
            "activation_bytes": live.get("activations", 0),
            "weight_cast_bytes": live.get("weight_casts", 0)}


def _warm_optimizer(job, params, counter: StepCounter, foreach: bool = True):
    """The optimizer with its state. Its state is created lazily by the first step: stepping
    once on zero gradients creates it (same tensors, same peak as a real first step's update), so
    the traced forward/backward that follows sees the steady-state memory of step 2+. `foreach`:
    the device's default implementation (trace/semantics.py `optimizer_foreach`)."""
    opt = build_optimizer(job.optimizer, params, foreach=foreach)
    counter.phase, counter.count_ops = "optimizer", False
    for p in params:
        p.grad = torch.zeros_like(p)
        counter.retag(p.grad, "gradients")
    opt.step()
    _tag_states(opt, counter)
    opt.zero_grad(set_to_none=True)
    counter.reset_peak()  # the real step below re-reaches this peak with states tagged
    return opt


def _forward_backward(job, bundle, batch: int, semantics, model, counter: StepCounter, tracker,
                      sem) -> tuple[int, int, dict[str, int]]:
    """One micro-batch's forward and backward (two with gradient accumulation: the second runs
    with the first's gradients live, and only its ops are counted). Returns the activation and
    autocast-cast bytes live at the end of the counted forward, and activations by module."""
    amp = semantics.autocast_dtype is not None
    activation_bytes = weight_cast_bytes = 0
    act_by_module: dict[str, int] = {}
    micro_batches = 2 if job.grad_accum > 1 else 1
    counter.marks.append(_mark(counter))
    for m in range(micro_batches):
        last = m == micro_batches - 1
        counter.count_ops = last
        counter.phase, counter.default_category = "forward", "activations"
        inputs = bundle.make_inputs(batch)
        if semantics.channels_last:
            inputs = {k: (v.contiguous(memory_format=torch.channels_last)
                          if isinstance(v, torch.Tensor) and v.dim() == 4 else v)
                      for k, v in inputs.items()}
        fwd_kwargs = {k: v for k, v in inputs.items() if not k.startswith("_")}
        with tracker, sem:
            sem.autocast_enabled = amp
            out = model(**fwd_kwargs)
            loss = bundle.loss(out, inputs)
            sem.autocast_enabled = False
            sem.clear_cast_cache()
            del out, fwd_kwargs
            if last:
                activation_bytes = counter.by_cat["activations"]
                weight_cast_bytes = counter.by_cat["weight_casts"]
                act_by_module = counter.live_by_module("activations")
                if counter.tag_blocks:   # the last block's share (`_last_block`)
                    counter.last_block_live = {
                        k: counter.live_by_block(k, counter.last_block)
                        for k in ("activations", "weight_casts")}
            gc.collect()
            counter.phase, counter.default_category = "backward", "temporaries"
            loss.backward()
        del loss, inputs
        gc.collect()
    return activation_bytes, weight_cast_bytes, act_by_module


def _mark(counter: StepCounter) -> tuple[int, int]:
    """Where the step is now: (memory log entries, allocation events) so far."""
    return len(counter.memory_log), len(counter.events)


def _gradient_made(counter: StepCounter, p) -> None:
    """A parameter's gradient is ready (autograd's AccumulateGrad ran: once per backward, every
    contribution summed first): it is tagged a gradient, and where this backward made `.grad`
    (the first of a step) the step with accumulation would instead add the new gradient into the
    one held (an `add_` reading both and writing one) and free it. Recorded as (ops so far,
    memory log entry of the tag, the block running, that `add_`) for predict/accumulate.py; the
    `add_`'s `host_ops` holds the host views this backward issued for the gradient (see there)."""
    n = len(counter.memory_log)
    counter.retag(p.grad, "gradients")
    if counter.phase != "backward" or not counter.count_ops:
        return
    g = p.grad
    # host views since the last kernel or the last gradient made before it: the views before
    # this AccumulateGrad and, here, its detach; `host_ops` carries them to predict/accumulate.py
    at = len(counter.records)
    last_at, last_pending = getattr(counter, "_grad_pending", (-1, 0))
    views = counter.host_pending - (last_pending if last_at == at else 0)
    counter._grad_pending = (at, counter.host_pending)
    add = OpRecord("add_", "other", "backward", 0.0, float(3 * g.numel() * g.element_size()),
                   str(g.dtype).replace("torch.", ""), counter._module(), counter.recompute, 0,
                   float(counter.tag_blocks and counter.block == counter.last_block),
                   host_ops=views)
    counter.gradients_made.append((len(counter.records), n if len(counter.memory_log) > n
                                   else None, counter.block, add))


def _tag_states(opt, counter: StepCounter) -> None:
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                counter.retag(v, "optimizer_states")


def _untraceable(name: str, e: Exception) -> TrainplanError:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    op = ""
    for token in str(e).split():
        if token.startswith("aten.") or "::" in token:
            op = token.strip("',.()")
            break
    what = f"{name} could not be traced on fake tensors: {type(e).__name__}: {msg[:300]}"
    if op:
        what += f" (op {op})"
    return TrainplanError(
        what,
        fix="the model likely computes shapes from data (e.g. .item(), .tolist(), nonzero); "
            "wrap it as py:<module>:<factory> with an input spec that avoids the data-dependent "
            "path, or report the op")


def _summarise(job, bundle, semantics, batch, counter: StepCounter, model, grad_bytes,
               state_bytes, activation_bytes, weight_cast_bytes, act_by_module, blocks,
               lora_names, seconds, stack=None, flash_eligible: int = 0,
               last_block: dict | None = None) -> Trace:
    total, trainable = count_parameters(model)
    uniq = {id(p): p for p in model.parameters()}.values()
    weight_bytes = stored_bytes(model)
    trainable_bytes = sum(p.numel() * p.element_size() for p in uniq if p.requires_grad)

    flops = {ph: {"matmul": 0.0, "attention": 0.0, "other": 0.0}
             for ph in ("forward", "backward", "optimizer")}
    moved = {ph: {"matmul": 0.0, "attention": 0.0, "other": 0.0}
             for ph in ("forward", "backward", "optimizer")}
    recompute = 0.0
    for r in counter.records:
        if r.phase not in flops:
            continue
        flops[r.phase][r.family] += r.flops
        moved[r.phase][r.family] += r.bytes
        if r.recompute:
            recompute += r.flops
    rows = _module_rows(model, counter, act_by_module)
    breakdown = {c: int(counter.peak_by_cat.get(c, 0)) for c in CATEGORIES}
    notes = list(job.notes) + list(bundle.notes)
    if counter.unknown_flop_ops:
        notes.append("FLOPs not counted for: " + ", ".join(sorted(counter.unknown_flop_ops)))
    if job.quantize.on:
        notes.append(_quantized_note(job, model, stack))
    units = _unit_bytes(model)
    gathered = _unit_bytes(model, compute_dtype(job.precision))
    packed, floating = dtype_split(model)
    experts = moe.expert_footprint(model, batch * (bundle.tokens_per_sample or 1),
                                   moe.top_k_of(getattr(model, "config", None)))
    return Trace(
        model=bundle.name, kind=bundle.kind, batch_size=batch, seq_len=job.seq_len,
        image_size=job.image_size, tokens_per_sample=bundle.tokens_per_sample,
        semantics=semantics, params_total=total, params_trainable=trainable,
        weight_bytes=weight_bytes, trainable_param_bytes=trainable_bytes,
        gradient_bytes=grad_bytes, optimizer_state_bytes=state_bytes,
        activation_bytes=activation_bytes, weight_cast_bytes=weight_cast_bytes,
        peak_allocated_bytes=counter.peak, peak_phase=counter.peak_phase,
        peak_breakdown_bytes=breakdown,
        phase_peaks={k: (v[0], {c: int(v[1].get(c, 0)) for c in CATEGORIES})
                     for k, v in counter.phase_peaks.items()},
        largest_block_param_bytes=units[0], root_param_bytes=units[1],
        largest_block_gathered_bytes=gathered[0], root_gathered_bytes=gathered[1],
        packed_weight_bytes=packed, floating_weight_elements=floating,
        expert_param_bytes=experts[0], expert_trainable_bytes=experts[1],
        moe_dispatch_elements=experts[2], hidden_size=_hidden_size(job, model),
        flops=flops, bytes_moved=moved,
        recompute_flops=recompute, ops=list(counter.records), modules=rows,
        timeline=downsample(counter.timeline), alloc_events=counter.events,
        memory_log=counter.memory_log,
        checkpointed_blocks=blocks, lora_modules=lora_names, trace_seconds=seconds, notes=notes,
        stack=stack, flash_eligible=flash_eligible,
        event_blocks=event_blocks(counter) if counter.tag_blocks else None,
        sources=store.digests(user_files()) if job.model.startswith("py:") else {},
        marks=list(counter.marks), gradients_made=list(counter.gradients_made),
        last_block=last_block)


def _unit_bytes(model, gathered_in: torch.dtype | None = None) -> tuple[int, int]:
    """(parameter bytes of the largest repeated block, what FSDP/ZeRO-3 gathers at a time;
    parameter bytes outside every block: embeddings, final norm, output head, what an FSDP wrap
    of the blocks leaves to the root unit, predict/sharding.py). Without blocks both are the
    whole model. `gathered_in`: count floating-point parameters at most this wide, as a
    MixedPrecision all-gather casts them; packed quantised weights (uint8, or bf16 storage with
    bnb_4bit_quant_storage) are gathered as they are."""
    from .checkpointing import find_blocks

    def nbytes(p) -> int:
        size = p.element_size()
        if gathered_in is not None and p.is_floating_point():
            size = min(size, torch.finfo(gathered_in).bits // 8)
        return p.numel() * size
    blocks = find_blocks(model)
    largest = max((sum(nbytes(p) for p in b.parameters()) for _, b in blocks),
                  default=sum(nbytes(p) for p in model.parameters()))
    inside = {id(p) for _, b in blocks for p in b.parameters()}
    uniq = {id(p): p for p in model.parameters()}
    return largest, sum(nbytes(p) for i, p in uniq.items() if i not in inside)


def _hidden_size(job, model) -> int:
    """The model's hidden size (HF config, or the reference transformer's dimensions)."""
    if job.transformer is not None:
        return int(job.transformer.hidden_size)
    cfg = getattr(model, "config", None)
    get = getattr(cfg, "get_text_config", None)
    cfg = get() if get else cfg
    h = getattr(cfg, "hidden_size", None)
    return int(h) if isinstance(h, int) else 0


def _quantized_note(job, model, stack: Stack | None = None) -> str:
    """What QLoRA stores, for the whole model: the quantised weights with their state, and the
    rest in its dtype. A cut trace (trace/depth.py) holds `stack.traced` of the `stack.blocks`
    alike blocks: what lies in them counts blocks / traced times."""
    from ..models.lora import QuantizedWeight
    from ..units import fmt_bytes, fmt_count
    inside: set[int] = set()
    scale = 1.0
    if stack is not None:
        inside = {id(m) for m in model.get_submodule(stack.path).modules()}
        inside |= {id(p) for p in model.get_submodule(stack.path).parameters()}
        scale = stack.blocks / stack.traced

    def times(obj) -> float:
        return scale if id(obj) in inside else 1.0
    qs = [m for m in model.modules() if isinstance(m, QuantizedWeight)]
    q_params = sum(m.shape[0] * m.shape[1] * times(m) for m in qs)
    q_bytes = sum((m.packed.numel() + m.quant_state.numel()) * times(m) for m in qs)
    rest = {id(p): p for n, p in model.named_parameters()
            if not n.endswith("packed") and not p.requires_grad}.values()
    r_params = sum(p.numel() * times(p) for p in rest)
    r_bytes = sum(p.numel() * p.element_size() * times(p) for p in rest)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in rest})
    why = (" (as peft's prepare_model_for_kbit_training casts them under mixed precision)"
           if "float32" in dtypes and job.precision.amp else "")
    return (f"{job.quantize.label}: {fmt_count(int(q_params))} weights in "
            f"{fmt_bytes(int(q_bytes))} with their quantisation state; "
            f"{fmt_count(int(r_params))} frozen parameters left unquantised (embeddings, norms, "
            f"head) in {'/'.join(dtypes) or '-'}, {fmt_bytes(int(r_bytes))}{why}")


def _packed_param_count(model) -> int:
    """Quantised weights count as the parameters they encode (QLoRA reports the base model's)."""
    from ..models.lora import QuantizedWeight
    n = 0
    for m in model.modules():
        if isinstance(m, QuantizedWeight):
            n += m.shape[0] * m.shape[1] - m.packed.numel()
    return n


def _module_rows(model, counter: StepCounter, act_by_module: dict[str, int]) -> list[ModuleRow]:
    """Per-module table; tracker names are '<RootClass>.<qualified name>'."""
    root = type(model).__name__ + "."

    def local(full: str) -> str:
        return full[len(root):] if full.startswith(root) else ""
    acts_in = _subtree_sums((local(k), v) for k, v in act_by_module.items())
    fwd_in = _subtree_sums((local(k), st.flops_forward) for k, st in counter.modules.items())
    bwd_in = _subtree_sums((local(k), st.flops_backward) for k, st in counter.modules.items())
    rows = []
    for name, mod in model.named_modules():
        ps = {id(p): p for p in mod.parameters()}
        params = sum(p.numel() for p in ps.values())
        trainable = sum(p.numel() for p in ps.values() if p.requires_grad)
        rows.append(ModuleRow(name or "(total)", name.count(".") + 1 if name else 0, params,
                              trainable, acts_in.get(name, 0), fwd_in.get(name, 0.0),
                              bwd_in.get(name, 0.0)))
    return rows


def _subtree_sums(values) -> dict[str, float]:
    """Sum (dotted module name, value) pairs over each name and its ancestors ("" is the root,
    holding all)."""
    out: dict[str, float] = {}
    for name, v in values:
        out[""] = out.get("", 0) + v
        if not name:
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            out[key] = out.get(key, 0) + v
    return out


def downsample(timeline: list[tuple[str, int]], n: int = 1500) -> list[tuple[str, int]]:
    if len(timeline) <= n:
        return timeline
    step = len(timeline) / n
    out = []
    for i in range(n):
        chunk = timeline[int(i * step): int((i + 1) * step)] or [timeline[-1]]
        out.append(max(chunk, key=lambda x: x[1]))
    return out
