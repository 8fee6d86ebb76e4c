"""Count what one traced training step does: FLOPs, bytes moved, live memory, by op and module.

`StepCounter` is a `TorchDispatchMode` stacked on FakeTensorMode. For every aten op it records:

* an `OpRecord` (ops.py): its family, FLOPs (`op_flops`), bytes read and written (inputs +
  outputs of ops that launch a kernel; views launch none), the kernel's shape (shapes.py), the
  module running, and the kernel-less ops the host dispatched before it; a convolution's bytes
  include the transposes CUDA makes of an operand not in its layout (cuda_layout.py); MoE
  grouped GEMMs run as CUDA runs them for fp32/fp16 operands, which PyTorch's meta kernel
  refuses (trace/moe.py);
* live memory: every new output storage is added, rounded up to the CUDA caching allocator's
  512-byte granularity, and removed by a `weakref.finalize` on the storage when PyTorch frees it.
  Each storage carries a category (weights, gradients, optimizer_states, activations,
  weight_casts, temporaries) so the peak can be split into named terms; the categories at the
  peak are snapshotted whenever a new peak is reached. Every allocation, free and change of
  category is logged (log.py), so that the peaks can be replayed for other sizes;
* the innermost module running (forward or backward) via `torch.utils.module_tracker`.
"""
from __future__ import annotations

import functools
import weakref
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import cuda_layout, moe
from .casting import dynamic_casting
from .log import Alloc, Event, Free, GradientMade, Mark, Reset, Retag
from .ops import ATTENTION_OPS, VIEW_OPS, OpRecord, _group_channels, op_family, op_flops
from .shapes import kernel_shape

ALLOC_ROUND = 512  # CUDA caching allocator rounds every block up to 512 bytes


@dataclass
class ModuleStats:
    flops_forward: float = 0.0
    flops_backward: float = 0.0
    activation_bytes: int = 0   # created in this module's forward, still live at forward end


@dataclass
class _Storage:
    nbytes: int
    category: str
    module: str
    phase: str
    serial: int
    block: int = -1      # the cut stack's block it was allocated in, or for (see `owner`)
    # windows.py: the allocations of the loop's n calls this one output of a batched call
    # stands for, (serial, bytes) each, in the loop's order (`track_windows`)
    parts: tuple = ()


def _round(n: int) -> int:
    return ((n + ALLOC_ROUND - 1) // ALLOC_ROUND) * ALLOC_ROUND if n else 0


# Ops that only answer a question about a tensor. The optimizers ask each parameter's device and
# step count every step (thousands of calls); they allocate nothing and launch no kernel.
METADATA_OPS = frozenset({torch.ops.prim.device.default, torch.ops.aten._local_scalar_dense.default,
                          torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
                          torch.ops.aten.sym_numel.default})

_DEVICE = torch.ops.prim.device.default
_ITEM = torch.ops.aten._local_scalar_dense.default


@functools.cache
def _inplace_foreach(func) -> bool:
    """`aten._foreach_<op>_` overloads: update every tensor of a list in place, return nothing.

    They change no tensor's metadata and allocate nothing, so the fake device has nothing to
    compute for them; its per-op cache key alone hashes every tensor of the list (an AdamW step
    over BERT-large's 390 parameters issues a dozen such ops).
    """
    name = func._schema.name.split("::")[-1]
    return name.startswith("_foreach_") and name.endswith("_") and not func._schema.returns


def _only_fake(tensors) -> bool:
    """True when every tensor is fake and none mirrors a real constant (an optimizer's step
    count, read back with .item()): real tensors and constants must see their update."""
    return all(isinstance(t, FakeTensor) and t.constant is None for t in tensors)


class StepCounter(TorchDispatchMode):
    """See module docstring. `phase` and `recompute` are set by the tracer."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing here is ever compiled: skip the torch._dynamo.disable wrapper PyTorch puts
        # around every mode's __torch_dispatch__ (a Python frame per op, ~10% of tracing time)
        return False

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase, self.block = value, -1      # no block runs as a phase begins
        self.host_pending = 0
        self.modules_at = self._module_calls()   # modules entered before this phase's ops

    def _module_calls(self) -> int:
        """The model's modules entered so far (tracer.py `_Tracker.calls`; 0 untracked)."""
        return getattr(getattr(self, "mt", None), "calls", 0)

    def __init__(self, module_tracker=None):
        super().__init__()
        self.phase = "setup"           # and `block`, the cut stack's block running: -1;
                                       # `host_pending`, kernel-less ops since the last record: 0
        self.recompute = False
        self.cuda_layouts = False      # a convolution's own layout conversions counted (set by
                                       # the tracer from KernelSemantics, cuda_layout.py)
        self.grad_pending = (-1, 0)    # (records, host_pending) at the last gradient made
                                       # (tracer.py `_gradient_made`)
        self.mt = module_tracker
        self.records: list[OpRecord] = []
        self.live = 0
        self.peak = 0
        self.peak_phase = "setup"
        self.by_cat = defaultdict(int)
        self.peak_by_cat: dict[str, int] = {}
        self.timeline: list[tuple[str, int]] = []   # (phase, live bytes) after each op
        self.events: list[Event] = []               # log.py: allocations and frees in order
        # what `phase_peaks` is computed from, in order, so that it can be recomputed for other
        # allocation sizes (derive/interpolate.py): log.py `replay_log`
        self.memory_log: list = []
        self.phase_peaks: dict[str, tuple[int, dict[str, int]]] = {}
        self.storages: dict[int, _Storage] = {}
        self.modules: dict[str, ModuleStats] = defaultdict(ModuleStats)
        self.default_category = "temporaries"
        self.unknown_flop_ops: set[str] = set()
        self.count_ops = True       # False: track memory only (warm-up)
        self.closed = False         # True once the step ends: later frees are teardown
        self._parents_key = None
        self._parents_name = ""
        # each event's block of the cut stack (trace/blocks.py sets `block`; -1: none): what
        # derive/repeat.py repeats to replay the allocator over the whole stack
        self.tag_blocks = False
        self.last_block = -1        # the cut stack's last block (trace/blocks.py sets it)
        self.last_block_live: dict[str, int] = {}   # tracer.py `_last_block`
        self._unknown: list[_Storage] = []          # `_tagged`
        # a no-grad forward through a cut stack (trace/generate.py): a block's output is freed
        # between blocks, when the next block's output replaces it, so that free is the next's
        self.no_grad_stack = False
        self.event_blocks: list[int] = []
        # trace/windows.py: n alike attention windows run as one call (`window_batch`, set
        # while the call runs), recorded as the n calls; the outputs of such a call, whose
        # backward is split alike (`_windows`)
        self.window_batch = 0
        self.window_outs: dict[int, int] = {}
        self.window_views = 0       # host_pending once the batched views are made
        self.window_extra = 0       # view ops the batching added (not the loop's)
        self.window_records: tuple[int, int] | None = None   # (first record, n) of the call
        self.marks: list[Mark] = []               # tracer.py `_mark`, `_gradient_made`
        self.gradients_made: list[GradientMade] = []

    # -- storage bookkeeping --------------------------------------------------------------
    def _module(self) -> str:
        """Innermost running module: the one entered last (tracer.py `_Tracker`), the deepest
        name where a tracker does not number its entries."""
        if self.mt is None:
            return ""
        parents, entered = self.mt.parents, getattr(self.mt, "entered", None)
        # the end of backward replaces the parents by {"Global"} without an append or a pop:
        # their number changes with it
        key = (self.mt.version, len(parents)) if entered is not None else frozenset(parents)
        if key != self._parents_key:
            self._parents_key = key
            order = (lambda n: (entered.get(n, 0), n.count("."), len(n))) if entered is not None \
                else (lambda n: (n.count("."), len(n)))
            self._parents_name = max(parents, key=order) if parents else ""
        return self._parents_name

    def owner(self, t) -> int | None:
        """The block a tensor's storage belongs to (-1: none), None when it is not tracked."""
        if not isinstance(t, torch.Tensor):
            return None
        rec = self.storages.get(t.untyped_storage()._cdata)
        return rec.block if rec is not None else None

    def track(self, t: torch.Tensor, category: str | None = None, block: int | None = None
              ) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.storages:
            if category is not None:
                self.retag(t, category)
            return
        nbytes = _round(st.nbytes())
        rec = _Storage(nbytes, category or self.default_category, self._module(), self.phase,
                       len(self.events), self.block if block is None else block)
        self.storages[key] = rec
        self._allocated(nbytes, rec)
        weakref.finalize(st, self._free, key)

    def _allocated(self, nbytes: int, rec: _Storage) -> int:
        """Log one allocation of `nbytes` for `rec` (its serial: the event's index, returned)
        and raise the peaks it reaches."""
        serial = len(self.events)
        self.live += nbytes
        self.by_cat[rec.category] += nbytes
        self.events.append(Event(serial, nbytes))
        self._tagged(rec.block, rec)
        self.memory_log.append(Alloc(serial, nbytes, rec.category, self.phase))
        if self.live > self.peak:
            self.peak = self.live
            self.peak_phase = self.phase
            self.peak_by_cat = dict(self.by_cat)
        if self.live > self.phase_peaks.get(self.phase, (-1,))[0]:
            self.phase_peaks[self.phase] = (self.live, dict(self.by_cat))
        return serial

    def track_windows(self, outs, n: int) -> None:
        """The outputs of one call over n alike windows (windows.py) allocated as the loop's n
        calls allocate theirs: call by call, each its share of every output over the windows
        (first dimension n) and its own copy of any other (the philox seed and offset). Each
        output's free frees its n allocations (`_free`)."""
        new = []
        for t in outs:
            st = t.untyped_storage()
            if st._cdata in self.storages:
                continue
            each = t.dim() >= 2 and t.shape[0] == n
            size = _round(st.nbytes() // n if each else st.nbytes())
            rec = _Storage(size * n, self.default_category, self._module(), self.phase, -1,
                           self.block)
            self.storages[st._cdata] = rec
            weakref.finalize(st, self._free, st._cdata)
            new.append((rec, size, []))
        for _ in range(n):
            for rec, size, parts in new:
                parts.append((self._allocated(size, rec), size))
        for rec, size, parts in new:
            rec.serial, rec.parts = parts[0][0], tuple(parts)

    def _tagged(self, block: int, rec: _Storage | None = None) -> None:
        """Record an event's block. A tensor made from nothing in the optimizer (UNKNOWN) takes
        the block of the next event that has one, as `event_blocks` reads it back, so that the
        ops over it (AdamW's `step += 1`) are its block's share (`_last_share`)."""
        self.event_blocks.append(block)
        if block == UNKNOWN:
            if rec is not None:
                self._unknown.append(rec)
        elif self._unknown:
            for r in self._unknown:
                r.block = block
            self._unknown.clear()

    def reset_peak(self) -> None:
        self.peak, self.peak_phase, self.peak_by_cat = self.live, self.phase, dict(self.by_cat)
        self.phase_peaks.clear()
        self.memory_log.append(Reset())

    def _free(self, key: int) -> None:
        rec = self.storages.pop(key, None)
        self.window_outs.pop(key, None)
        if rec is None or self.closed:   # after the step: the model torn down, whenever GC runs
            return
        self.live -= rec.nbytes
        self.by_cat[rec.category] -= rec.nbytes
        tag = rec.block if self.phase in _BY_OWNER else self.block
        if tag == -1 and self.no_grad_stack and 0 <= rec.block < self.last_block:
            tag = rec.block + 1
        for serial, nbytes in rec.parts or ((rec.serial, rec.nbytes),):
            self.events.append(Event(serial, -nbytes))
            self._tagged(tag)
            self.memory_log.append(Free(serial))

    def retag(self, t: torch.Tensor, category: str) -> None:
        rec = self.storages.get(t.untyped_storage()._cdata)
        if rec is None or rec.category == category:
            return
        self.by_cat[rec.category] -= rec.nbytes
        self.by_cat[category] += rec.nbytes
        rec.category = category
        for serial, _ in rec.parts or ((rec.serial, 0),):
            self.memory_log.append(Retag(serial, category))

    def _last_share(self, *groups) -> float:
        """The last block's tensors' share of the bytes an op reads and writes (`OpRecord`)."""
        total = mine = 0
        for tensors in groups:
            for t in tensors:
                n = t.numel() * t.element_size()
                total += n
                if self.owner(t) == self.last_block:
                    mine += n
        return mine / total if total else 0.0

    def live_by_block(self, category: str, block: int) -> int:
        """Bytes of `category` live now that were made in (or belong to) `block`."""
        return sum(r.nbytes for r in self.storages.values()
                   if r.category == category and r.block == block)

    def live_by_module(self, category: str) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for rec in self.storages.values():
            if rec.category == category:
                out[rec.module] += rec.nbytes
        return out

    # -- per-op accounting ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in METADATA_OPS:  # Python-side queries (t.device, .item()): no kernel, no memory
            if func is _DEVICE:  # answered from the fake tensor, as FakeTensorMode would
                device = getattr(args[0], "fake_device", None)
                if device is not None:
                    return device
            elif func is _ITEM:  # .item() of a fake tensor mirroring a real constant
                constant = getattr(args[0], "constant", None)
                if constant is not None:
                    with no_dispatch():  # a real tensor: read it without re-entering the modes
                        return constant.item()
            return func(*args, **kwargs)
        inplace = _inplace_foreach(func)
        if inplace and _only_fake(args[0]):
            out = None  # see _inplace_foreach: nothing to compute on the fake device
        elif func is moe.GROUPED_MM and moe.needs_fake(args, kwargs):
            out = moe.grouped_mm_fake(*args, **kwargs)  # fp32/fp16: CUDA's fallback (moe.py)
        else:
            out = func(*args, **kwargs)
        packet = func._overloadpacket
        converted = 0                  # bytes a CUDA convolution's layout conversions move
        if self.cuda_layouts:          # and the layout it writes (cuda_layout.py)
            out, converted = cuda_layout.convolution(packet, args, out)
        outs = _tensors(out)
        windows = self._windows(packet, args, outs) if self.window_batch or self.window_outs \
            else 1
        if windows > 1:
            self.track_windows(outs, windows)
        elif self.tag_blocks and self.phase in _BY_OWNER:
            for t, b in zip(outs, _owners(self, outs, args)):
                self.track(t, block=b)
        else:
            for t in outs:
                self.track(t)
        if not self.count_ops or packet in VIEW_OPS:
            self.host_pending += 1
            self.timeline.append((self.phase, self.live))
            return out
        ins = _tensors(args) + _tensors(tuple(kwargs.values()))
        written = _tensors(args[0]) if inplace else outs  # in place: the list is what is written
        nbytes = sum(t.numel() * t.element_size() for t in ins) + \
            sum(t.numel() * t.element_size() for t in written) + converted
        flops = op_flops(func, args, kwargs, out, self.unknown_flop_ops)
        dtype = next((str(t.dtype) for t in ins if t.is_floating_point()), "")
        mod = self._module()
        phase = self.phase
        last = 0.0
        if self.tag_blocks:
            last = self._last_share(ins, written) if phase in _BY_OWNER else \
                float(self.block == self.last_block)
        shape = kernel_shape(func, args, kwargs)
        if last and phase in _BY_OWNER and len(shape) == 2 and isinstance(args[0], (list, tuple)):
            # a multi-tensor op: how many of its list's tensors are the last block's (shapes.py)
            shape += (sum(self.owner(t) == self.last_block for t in args[0]),)
        entered = self._module_calls()          # the model's modules entered so far
        record = OpRecord(str(packet).split(".")[-1], op_family(packet), phase, flops,
                          float(nbytes), dtype.replace("torch.", ""), mod, self.recompute,
                          _group_channels(packet, args), last, shape, self.host_pending,
                          entered - self.modules_at,
                          dynamic_casting(func, packet, args, ins, written))
        if windows > 1:
            self._per_window(record, windows, ins, written)
        else:
            self.records.append(record)
        self.host_pending, self.modules_at = 0, entered
        if flops and mod:
            st = self.modules[mod]
            if phase == "forward":
                st.flops_forward += flops
            elif phase == "backward":
                st.flops_backward += flops
        self.timeline.append((phase, self.live))
        return out

    def _windows(self, packet, args, outs) -> int:
        """How many alike windows (trace/windows.py) the op runs on at once: the batched call's
        (`window_batch`), or in backward an attention kernel's reading such a call's output."""
        if self.window_batch > 1:
            if packet in ATTENTION_OPS:
                for t in outs:
                    self.window_outs[t.untyped_storage()._cdata] = self.window_batch
            return self.window_batch
        if self.window_outs and packet in ATTENTION_OPS:
            for t in _tensors(args):
                n = self.window_outs.get(t.untyped_storage()._cdata)
                if n:
                    return n
        return 1

    def _per_window(self, record: OpRecord, n: int, ins, written) -> None:
        """Record one call over n alike windows as the loop's n calls (windows.py): each 1/n of
        its FLOPs and of the bytes of its tensors over the windows (q, k, v, outputs, log-sum-exp
        and gradients: n first; a vector or scalar, the philox seed and offset, is every call's
        own), an attention kernel's batch (its shape's first dimension: the
        windows) 1/n of the call's. Host ops: the first call's are the batched call's, less the
        views the batching added; in the batched forward each later one dispatches the views
        made inside the call (and, windows.py `joined`, after it). In backward the loop's cat
        cuts its gradient in n views where the batched one cuts one, before the first call; each
        later call dispatches the views made since the gradient reached it (`window_views`)."""
        scalars = sum(t.numel() * t.element_size() for t in (*ins, *written)
                      if t.dim() < 2 or t.shape[0] != n)
        shape = record.shape
        if record.family == "attention" and shape:
            shape = (shape[0] // n,) + tuple(shape[1:])
        each = record.copied(flops=record.flops / n, shape=shape,
                             bytes=(record.bytes - scalars) / n + scalars)
        forward = self.window_batch > 1
        later = record.host_ops - self.window_views
        first = record.host_ops - self.window_extra if forward else record.host_ops + n - 1
        if forward:
            self.window_records = (len(self.records), n)
            self.window_extra = 0
        self.records.append(each.copied(host_ops=max(0, first)))
        # the loop's later calls enter no module (its attention is a function)
        self.records.extend(each.copied(host_ops=max(0, later), host_modules=0)
                            for _ in range(n - 1))


_BY_OWNER = ("setup", "optimizer")   # phases whose events are tagged by the tensors' blocks


def _owners(counter: StepCounter, outs: list, args) -> list[int]:
    """Each output's block outside forward and backward (the optimizer): a multi-tensor op's
    i-th output is its first list's i-th tensor's; any other op's, its first input's that
    belongs to a block (`zeros_like(p)`, `p.grad.add(...)`), else the block running (set while
    the parameters are created)."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)) and len(first) == len(outs) and first and \
            all(isinstance(t, torch.Tensor) for t in first):
        return [-1 if b is None else b for b in map(counter.owner, first)]
    for t in _tensors(args):
        b = counter.owner(t)
        if b is not None:
            return [b] * len(outs)
    return [UNKNOWN if counter.phase == "optimizer" else counter.block] * len(outs)


UNKNOWN = -2   # an optimizer tensor made from nothing (AdamW's `step`): see `event_blocks`


def event_blocks(counter: StepCounter) -> list[int]:
    """Each event's block (trace/blocks.py), an optimizer tensor made from no other (a
    parameter's `step` scalar, a state `torch.zeros(shape)`) given the block of the next
    event that has one: state is created parameter by parameter, its own first."""
    tags = list(counter.event_blocks)
    resolved: dict[int, int] = {}
    following = -1
    for i in range(len(tags) - 1, -1, -1):
        serial, nbytes = counter.events[i]
        if tags[i] == UNKNOWN and nbytes >= 0:
            tags[i] = resolved[serial] = following
        elif tags[i] != UNKNOWN:
            following = tags[i]
    for i, (serial, nbytes) in enumerate(counter.events):
        if tags[i] == UNKNOWN:
            tags[i] = resolved.get(serial, -1)
    return tags


def _tensors(x) -> list[torch.Tensor]:
    """Tensors in an op's arguments or outputs (flat, or one level of list/tuple nesting)."""
    if isinstance(x, torch.Tensor):
        return [x]
    out = []
    if isinstance(x, (list, tuple)):
        for e in x:
            if isinstance(e, torch.Tensor):
                out.append(e)
            elif isinstance(e, (list, tuple)):
                out.extend(t for t in e if isinstance(t, torch.Tensor))
            elif e is not None and not isinstance(e, (int, float, bool, str, torch.dtype,
                                                      torch.device, torch.memory_format)):
                out.extend(t for t in tree_flatten(e)[0] if isinstance(t, torch.Tensor))
    return out


