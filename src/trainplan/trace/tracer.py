"""Trace one training step on fake tensors: no GPU, no weights, about a second for a 7B model.

The model is built on the meta device, then every parameter and buffer is re-created as a fake
CPU tensor inside `FakeTensorMode` (fake *cuda* tensors cannot train on a CPU build: their
backward dispatches to CUDA kernels a CPU build does not have). The step runs under:

    FakeTensorMode  <-  StepCounter (aten ops: FLOPs, bytes, live memory)
                    <-  TargetSemantics (torch functions: autocast, dropout, attention kernel)
                    <-  ModuleTracker (which module runs)

The model and its fake parameters are prepare.py's; the counter is counters.py's. The
optimizer's state is created first by one step on zero gradients (the state is created lazily,
so the peak of a real run comes in step 2), then one forward + loss + backward + step is traced and
its ops kept for the time model. With gradient accumulation one extra micro-batch runs first, so
gradients are live during the measured forward, as in micro-batches 2..K of a real step.
"""
from __future__ import annotations

import contextlib
import gc
import time
from typing import NamedTuple

import torch
from torch.utils.module_tracker import ModuleTracker

from ..errors import TrainplanError
from ..models import ModelBundle, build_model
from ..models.custom import user_files
from ..spec import every_k
from . import fp8, hf_values, moe, store, windows
from . import blocks as block_tags
from .checkpointing import apply_checkpointing
from .counters import StepCounter, event_blocks
from .facts import ModuleRow, OptimizerPart, Trace
from .fake_cache import fake_mode
from .log import CATEGORIES, GradientMade, Mark, TraceLog, downsample
from .ops import OpRecord
from .optimizers import build_optimizer, clip_gradients
from .prepare import (_hidden_size, _materialise, _quantized_note, _unit_bytes, compute_dtype,
                      count_parameters, dtype_split, prepare_model, stored_bytes)
from .emulation import TargetSemantics
from .semantics import KernelSemantics
from .stack import Stack, cut


class _Tracker(ModuleTracker):
    """ModuleTracker that registers no backward hooks while a checkpointed block is recomputed.

    ModuleTracker keeps a handle to a multi-grad hook on every module's inputs and outputs until
    it exits. For the backward's rerun of a checkpointed block those hooks sit on a graph nobody
    backpropagates through, and the handles keep that graph, with every tensor it saved, alive:
    each recomputed block then stayed live to the end of backward (BERT-large fp32 b1 s512 with
    full checkpointing: backward peak 7.05 GB instead of 5.37 GB). During the rerun only the
    module names are pushed and popped, for attribution.

    It also numbers each entry (`entered`), so that the innermost running module is the one
    entered last. ModuleTracker's backward pops a module once the gradients of its positional
    inputs are made, and a module called with keyword arguments only (transformers' attention)
    has none: its name stays among the parents to the end of backward. Picked by the depth of
    its name (ties by set order, which changes with Python's string hashing), a backward op of
    block 2's attention could go to block 3's (an 8-block Llama, SDPA: backward FLOPs 84, 136,
    84, 241 M for blocks 0-3, each 136 M in truth); the one entered last is the module autograd
    is in now.

    Only the model's own modules are entered. ModuleTracker's hooks are global, so a module the
    model does not hold would be entered too, under its class name, outside the model's rows:
    transformers >= 5.25 with `kernels` installed (a dependency since 5.25) makes functions such
    as Llama's apply_rotary_pos_emb one `Func` module shared by every model
    (kernels/_internals/layer/layer.py `use_kernel_forward_from_hub` on a function), which put
    each attention's rotated queries in a row of their own (`_module_rows`: the model's total)
    instead of the attention's. Such a module is the function it wraps: its work is its caller's,
    as it was without `kernels`.
    """

    recomputing = False

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.entered: dict[str, int] = {}   # module name -> number of its latest entry
        self.calls = 0                      # the model's modules entered so far (forward, rerun)
        self.version = 0                    # appends and pops so far (counters.py's cache key)
        self._model = model

    def _get_append_fn(self, name, is_bw):
        append = super()._get_append_fn(name, is_bw)

        def fn(*args) -> None:
            append(*args)
            self.version += 1
            self.entered[name] = self.version
        return fn

    def _get_pop_fn(self, name, is_bw):
        pop = super()._get_pop_fn(name, is_bw)

        def fn(*args) -> None:
            pop(*args)
            self.version += 1
        return fn

    def __enter__(self):
        self._get_mod_name(self._model)     # names the model's every module (`_known_modules`)
        return super().__enter__()

    def _fw_pre_hook(self, mod, input) -> None:
        if mod not in self._known_modules:          # not the model's (the class docstring)
            return None
        self.calls += 1
        if self.recomputing:
            return self._get_append_fn(self._get_mod_name(mod), False)()
        return super()._fw_pre_hook(mod, input)

    def _fw_post_hook(self, mod, input, output) -> None:
        if mod not in self._known_modules:
            return None
        if self.recomputing:
            return self._get_pop_fn(self._get_mod_name(mod), False)()
        return super()._fw_post_hook(mod, input, output)


_traced = 0            # steps traced by this process since its last full collection
FULL_COLLECTION_EVERY = 16


def _collect_and_freeze() -> None:
    """Collect cyclic garbage, then freeze what is live, so that a step's phase-end collections
    scan only its own objects, not torch's ~350,000 (trace_step). What a trace froze stays
    frozen after it: the next trace's collection then scans only what was made since (the last
    step's objects), where unfreezing would make it a full one (a quarter of a short trace's
    time: docs/speed_history.md). What was live at a freeze and later became cyclic garbage is
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


@contextlib.contextmanager
def held_collections():
    """A trace's collector: off while it runs (cyclic garbage is collected at phase ends, so
    peaks do not depend on GC timing), after `_collect_and_freeze` (so those collections scan
    only the trace's objects)."""
    gc.disable()
    _collect_and_freeze()
    try:
        yield
    finally:
        gc.enable()


class _Setup(NamedTuple):
    """The model as the step runs it (`_set_up`)."""

    bundle: ModelBundle
    stack: Stack | None
    lora_names: list[str]
    checkpointed: list[str]
    counter: StepCounter
    sem: TargetSemantics
    tracker: _Tracker
    in_blocks: dict[int, int] | None       # id(module) -> its block of the cut stack


class _Step(NamedTuple):
    """What the traced step measured that the counter does not hold (`_run`)."""

    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int          # live at the end of the counted forward
    weight_cast_bytes: int
    activations_by_module: dict[str, int]
    last_block: dict[str, float] | None


def trace_step(job, semantics: KernelSemantics, batch_size: int | None = None,
               extra_mode=None, routing: moe.Routing | None = None,
               depth: int | None = None) -> Trace:
    """Trace one optimizer step of `job` at micro-batch `batch_size` (default job.batch_size).

    `extra_mode`, if given, is a dispatch mode entered inside the fake mode for the whole step
    (tests use PyTorch's MemTracker to cross-check the live-memory peak). `routing` is the MoE
    routing assumption (trace/moe.py), by default the job's. `depth`: trace only the first
    `depth` blocks of the model's repeated stack (trace/stack.py; the whole model where it has
    none); the trace's `stack` says so.
    """
    t0 = time.perf_counter()
    batch = batch_size or job.batch_size
    setup = _set_up(job, semantics, routing, depth)
    with held_collections():
        try:
            step = _run(job, semantics, batch, setup, extra_mode)
        except TrainplanError:
            raise
        except Exception as e:  # an op the fake device cannot run
            raise _untraceable(setup.bundle.name, e, job) from None
    if setup.sem.bias_grad_calls:
        setup.bundle.notes.append(
            f"{setup.sem.bias_grad_calls} attention calls a step take a float bias that needs a "
            "gradient: PyTorch refuses flash and cuDNN for them and runs the memory-efficient "
            "kernel, which writes the bias gradient (b x heads x s x s) in backward")
    return _summarise(job, semantics, batch, setup, step, time.perf_counter() - t0)


def _set_up(job, semantics: KernelSemantics, routing, depth: int | None) -> _Setup:
    """The model built on the meta device and cut to `depth` blocks, the job applied to it
    (prepare.py), FP8 linears, checkpointing with the rerun's context, and the counter, target
    semantics and module tracker the step runs under."""
    bundle = build_model(job, attention=semantics.attention)
    stack = cut(bundle.module, depth, every=every_k(job.grad_checkpointing) or 1) if depth \
        else None
    bundle.notes.extend(moe.configure(bundle.module, routing or moe.routing_for(job),
                                      moe.top_k_of(getattr(bundle.module, "config", None))))
    lora_names = prepare_model(job, bundle, semantics)
    model = bundle.module
    model.train()
    counter = StepCounter()
    counter.cuda_layouts = semantics.cuda_layouts
    sem = TargetSemantics(semantics, on_weight_cast=lambda t: counter.track(t, "weight_casts"))
    batch = windows.WindowBatch(counter)
    if windows.install(model, batch):   # alike attention windows as one call (windows.py)
        sem.windows = batch
    if semantics.fp8:      # FP8 linears (trace/fp8.py); their FP8 weight copies are weight casts
        fp8.convert(model, semantics.fp8, semantics.fp8_transpose,
                    on_weight_cast=lambda t: counter.track(t, "weight_casts"))
    amp = semantics.autocast_dtype is not None
    tracker = _Tracker(model)
    counter.mt = tracker

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

    checkpointed = apply_checkpointing(model, job.grad_checkpointing, recompute_context,
                                       reentrant=job.reentrant_checkpointing)
    if semantics.channels_last:
        model.to(memory_format=torch.channels_last)
    in_blocks = None
    if stack is not None:          # which block each event happens in (trace/blocks.py)
        cut_blocks = model.get_submodule(stack.path)
        in_blocks = block_tags.module_blocks(cut_blocks, stack.period)
        block_tags.tag(counter, cut_blocks, stack.period)
    return _Setup(bundle, stack, lora_names, checkpointed, counter, sem, tracker, in_blocks)


def _run(job, semantics: KernelSemantics, batch: int, setup: _Setup, extra_mode) -> _Step:
    """The step on fake tensors: parameters materialised, the optimizer's state made by a
    warm-up step, the counted micro-batch(es), the optimizer step."""
    bundle, counter, model = setup.bundle, setup.counter, setup.bundle.module
    fake = fake_mode()
    with fake, counter, hf_values.as_on_gpu(), \
            (extra_mode if extra_mode is not None else contextlib.nullcontext()):
        _materialise(model, counter, setup.in_blocks)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise TrainplanError(f"{bundle.name} has no trainable parameter in this job.",
                                 fix="unfreeze something, or add LoRA adapters")
        for p in params:
            p.register_post_accumulate_grad_hook(lambda p: _gradient_made(counter, p))
        opt = _warm_optimizer(job, params, counter, semantics.optimizer_foreach)
        activation_bytes, weight_cast_bytes, act_by_module = _forward_backward(
            job, bundle, batch, semantics, model, counter, setup.tracker, setup.sem)
        counter.phase = "optimizer"
        counter.marks.append(_mark(counter))
        clip_gradients(params, job.max_grad_norm, semantics.optimizer_foreach)
        opt.step()
        counter.marks.append(_mark(counter))     # the gradients freed (derive/swap.py)
        opt.zero_grad(set_to_none=True)
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        state_bytes = counter.by_cat["optimizer_states"]
        last_block = (_last_block(_last_of(model, setup.stack), counter)
                      if setup.stack is not None else None)
        counter.closed = True   # the step's events end here, not when GC frees the model
    return _Step(grad_bytes, state_bytes, activation_bytes, weight_cast_bytes, act_by_module,
                 last_block)


def trace_optimizer(job, semantics: KernelSemantics, depth: int | None = None) -> OptimizerPart:
    """`job`'s optimizer alone, as `trace_step` runs it: the model set up and its parameters
    made the same way, the warm-up step, then in place of the forward and backward a zero
    gradient per trainable parameter (in the parameters' order), and the update, counted. A
    fraction of a step's trace: no forward, no backward."""
    t0 = time.perf_counter()
    setup = _set_up(job, semantics, None, depth)
    counter, model = setup.counter, setup.bundle.module
    with held_collections():
        try:
            with fake_mode(), counter:
                _materialise(model, counter, setup.in_blocks)
                params = [p for p in model.parameters() if p.requires_grad]
                opt = _warm_optimizer(job, params, counter, semantics.optimizer_foreach)
                marks = [_mark(counter)]
                for p in params:              # not read: the step's own backward makes them
                    p.grad = torch.zeros_like(p)
                    counter.retag(p.grad, "gradients")
                counter.phase, counter.count_ops = "optimizer", True
                marks.append(_mark(counter))
                clip_gradients(params, job.max_grad_norm, semantics.optimizer_foreach)
                opt.step()
                marks.append(_mark(counter))
                opt.zero_grad(set_to_none=True)
                states = counter.by_cat["optimizer_states"]
                last = (counter.live_by_block("optimizer_states", counter.last_block)
                        if setup.stack is not None else 0)
                counter.closed = True
        except TrainplanError:
            raise
        except Exception as e:
            raise _untraceable(setup.bundle.name, e, job) from None
    log = TraceLog(counter.memory_log, counter.events,
                   event_blocks(counter) if counter.tag_blocks else None, marks)
    return OptimizerPart(log, list(counter.records), states, last,
                         frozenset(counter.unknown_flop_ops), time.perf_counter() - t0)


def _last_of(model: torch.nn.Module, stack: Stack) -> torch.nn.Module:
    """The cut stack's last block: its last layer, or its last `period` layers together."""
    layers = model.get_submodule(stack.path)
    return layers[-1] if stack.period == 1 else torch.nn.ModuleList(layers[-stack.period:])


def _last_block(block: torch.nn.Module, counter: StepCounter) -> dict[str, float]:
    """What the last block of a cut stack adds to the trace's totals (what one more alike block
    adds: derive/stitch.py `extend`): its parameters, their bytes as stored, trainable, as
    gradients and as optimizer state, and the activations and autocast casts left live at the end
    of the forward by the block before it, which one more block turns it into: the last block's
    output is kept by the head only where the head needs it for its backward (a frozen linear
    under LoRA does not), where an inner block's is kept by the block after it (its
    checkpoint's input)."""
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
                if counter.tag_blocks:   # an inner block's share (`_last_block`)
                    inner = max(counter.last_block - 1, 0)
                    counter.last_block_live = {
                        k: counter.live_by_block(k, inner)
                        for k in ("activations", "weight_casts")}
            gc.collect()
            counter.phase, counter.default_category = "backward", "temporaries"
            loss.backward()
        del loss, inputs
        gc.collect()
    return activation_bytes, weight_cast_bytes, act_by_module


def _mark(counter: StepCounter) -> Mark:
    """Where the step is now: the memory log's and the events' lengths so far."""
    return Mark(len(counter.memory_log), len(counter.events))


def _gradient_made(counter: StepCounter, p) -> None:
    """A parameter's gradient is ready (autograd's AccumulateGrad ran: once per backward, every
    contribution summed first): it is tagged a gradient, and where this backward made `.grad`
    (the first of a step) the step with accumulation would instead add the new gradient into the
    one held (an `add_` reading both and writing one) and free it. Recorded as (ops so far,
    memory log entry of the tag, the block running, that `add_`) for derive/accumulate.py; the
    `add_`'s `host_ops` holds the host views this backward issued for the gradient (see there)."""
    n = len(counter.memory_log)
    counter.retag(p.grad, "gradients")
    if counter.phase != "backward" or not counter.count_ops:
        return
    g = p.grad
    # host views since the last kernel or the last gradient made before it: the views before
    # this AccumulateGrad and, here, its detach; `host_ops` carries them to derive/accumulate.py
    at = len(counter.records)
    last_at, last_pending = counter.grad_pending
    views = counter.host_pending - (last_pending if last_at == at else 0)
    counter.grad_pending = (at, counter.host_pending)
    add = OpRecord("add_", "other", "backward", 0.0, float(3 * g.numel() * g.element_size()),
                   str(g.dtype).replace("torch.", ""), counter._module(), counter.recompute, 0,
                   float(counter.tag_blocks and counter.block == counter.last_block),
                   host_ops=views)
    counter.gradients_made.append(GradientMade(len(counter.records), n if len(counter.memory_log)
                                               > n else None, counter.block, add))


def _tag_states(opt, counter: StepCounter) -> None:
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                counter.retag(v, "optimizer_states")


def _untraceable(name: str, e: Exception, job=None) -> TrainplanError:
    """The error for a step the fake device could not run. An AssertionError or ValueError is
    the model's own check of its inputs (timm's MaxViT: "height (75) must be divisible by window
    (9)"), which says what to change; anything else is most likely an op that needs the data."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    op = ""
    for token in str(e).split():
        if token.startswith("aten.") or "::" in token:
            op = token.strip("',.()")
            break
    what = f"{name} could not be traced on fake tensors: {type(e).__name__}: {msg[:300]}"
    if op:
        what += f" (op {op})"
    if isinstance(e, (AssertionError, ValueError)) and not op:
        size = getattr(job, "image_size", None)
        return TrainplanError(what, fix=(
            f"the model's own check refused these inputs: leave --image-size {size} out to use "
            "its own size, or give one its layers divide" if size else
            "the model's own check refused these inputs: change the setting it names"))
    return TrainplanError(
        what,
        fix="the model likely computes shapes from data (e.g. .item(), .tolist(), nonzero); "
            "wrap it as py:<module>:<factory> with an input spec that avoids the data-dependent "
            "path, or report the op")


def _summarise(job, semantics: KernelSemantics, batch: int, setup: _Setup, step: _Step,
               seconds: float) -> Trace:
    """The trace: the counter's records and peaks, the model's parameter totals (prepare.py),
    the module table, notes, and the log (log.py)."""
    bundle, counter, model, stack = setup.bundle, setup.counter, setup.bundle.module, setup.stack
    total, trainable = count_parameters(model)
    uniq = {id(p): p for p in model.parameters()}.values()
    trainable_bytes = sum(p.numel() * p.element_size() for p in uniq if p.requires_grad)
    flops, moved, recompute = _work(counter.records)
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
    log = TraceLog(counter.memory_log, counter.events,
                   event_blocks(counter) if counter.tag_blocks else None, list(counter.marks),
                   list(counter.gradients_made), downsample(counter.timeline))
    return Trace(
        model=bundle.name, kind=bundle.kind, batch_size=batch, seq_len=job.seq_len,
        image_size=job.image_size, tokens_per_sample=bundle.tokens_per_sample,
        semantics=semantics, params_total=total, params_trainable=trainable,
        weight_bytes=stored_bytes(model), trainable_param_bytes=trainable_bytes,
        gradient_bytes=step.gradient_bytes, optimizer_state_bytes=step.optimizer_state_bytes,
        activation_bytes=step.activation_bytes, weight_cast_bytes=step.weight_cast_bytes,
        peak_allocated_bytes=counter.peak, peak_phase=counter.peak_phase,
        peak_breakdown_bytes={c: int(counter.peak_by_cat.get(c, 0)) for c in CATEGORIES},
        phase_peaks={k: (v[0], {c: int(v[1].get(c, 0)) for c in CATEGORIES})
                     for k, v in counter.phase_peaks.items()},
        largest_block_param_bytes=units[0], root_param_bytes=units[1],
        largest_block_gathered_bytes=gathered[0], root_gathered_bytes=gathered[1],
        packed_weight_bytes=packed, floating_weight_elements=floating,
        expert_param_bytes=experts[0], expert_trainable_bytes=experts[1],
        moe_dispatch_elements=experts[2], hidden_size=_hidden_size(job, model),
        flops=flops, bytes_moved=moved, recompute_flops=recompute, ops=list(counter.records),
        modules=_module_rows(model, counter, step.activations_by_module), log=log,
        checkpointed_blocks=setup.checkpointed, lora_modules=setup.lora_names,
        trace_seconds=seconds, notes=notes, stack=stack, flash_eligible=setup.sem.flash_eligible,
        sdpa_calls=setup.sem.sdpa_calls,
        sources=store.digests(user_files()) if job.model.startswith("py:") else {},
        last_block=step.last_block)


def _work(records) -> tuple[dict, dict, float]:
    """(FLOPs by phase and family, bytes moved by phase and family, recomputed FLOPs)."""
    flops = {ph: {"matmul": 0.0, "attention": 0.0, "other": 0.0}
             for ph in ("forward", "backward", "optimizer")}
    moved = {ph: {"matmul": 0.0, "attention": 0.0, "other": 0.0}
             for ph in ("forward", "backward", "optimizer")}
    recompute = 0.0
    for r in records:
        if r.phase not in flops:
            continue
        flops[r.phase][r.family] += r.flops
        moved[r.phase][r.family] += r.bytes
        if r.recompute:
            recompute += r.flops
    return flops, moved, recompute


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
