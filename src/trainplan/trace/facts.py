"""What a traced step is: its facts (`Trace`), its op records (`OpRecord`), its memory log (log.py
`TraceLog`), and what is derived from it alone and kept with it (`TraceDerived`); what an
inference forward is (`InferenceTrace`, traced by generate.py).

A `Trace` is made once (tracer.py) or derived from others (trace/derive/: stitched from a cut
model's, extended by one block, with gradient accumulation, at another micro-batch, under
another dtype's name) and never changed after. Every accelerator, strategy and rung reads the
same trace, so what is computed from it alone is computed once and kept in `derived`: the op
table the time model reads (predict/optable.py), the caching allocator's replays (derive/
replays.py), the trace with one block more (derive/stitch.py `extend`).

No PyTorch here: a stored trace unpickles, and a plan reads it, without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .log import TraceLog
from .semantics import KernelSemantics
from .stack import Stack


class OpRecord(NamedTuple):
    """One aten op of the traced step, the unit the time model works on.

    A named tuple, never changed once made: a stored trace's records unpickle as plain tuples
    made again in C (lazy.py `_decode`), about three times faster than objects with a __dict__,
    which a warm plan over every platform spends a second of its time on (issue 41)."""

    name: str
    family: str          # matmul | attention | other
    phase: str           # forward | backward | optimizer
    flops: float
    bytes: float         # read + written
    dtype: str           # dtype of the first floating input (what the kernel computes in)
    module: str
    recompute: bool = False
    group_channels: int = 0   # convolutions: input channels per group (1 = depthwise)
    # a cut trace's (trace/blocks.py): the share of the op's work that is the last block's, what
    # one more block adds to it (derive/stitch.py `extend`): 1 for an op the block runs, for a
    # multi-tensor optimizer op the block's tensors' share of its bytes, else 0
    last_block: float = 0.0
    # the dimensions the kernel computes over (trace/shapes.py): GEMMs, attention, list lengths
    shape: tuple = ()
    # ops the host dispatched since the op before that launch no kernel (views, metadata
    # queries): CPU time the host spends before it can issue this one (predict/host.py)
    host_ops: int = 0
    # the model's modules entered (their Python forward run) since the op before: the host runs
    # the model's own code between kernels (predict/host.py `module_s`); forward and a
    # checkpointed block's rerun only, as the backward runs no module code
    host_modules: int = 0
    # CUDA runs it through TensorIterator's dynamic-casting loop (trace/casting.py): an
    # elementwise op whose tensors mix floating dtypes, or a half-to-float copy; scalar loads,
    # no vector ones (predict/timing.py `cast_bw`)
    cast: bool = False

    def copied(self, **changes) -> OpRecord:
        """A copy with `changes`: what `_replace` gives, in two thirds of its time (0.61 against
        0.91 us for three changes, timeit, 2026-11-28): a warm plan copies hundreds of thousands
        of records (derive/interpolate.py, stitch.py, twins.py)."""
        values = list(self)
        for k, v in changes.items():
            values[_OP_FIELD[k]] = v
        return tuple.__new__(OpRecord, values)


_OP_FIELD = {name: i for i, name in enumerate(OpRecord._fields)}


class ModuleRow(NamedTuple):
    """One module's row of the module table (`inspect`): its parameters, the activations it
    saves and the FLOPs of its subtree. A named tuple, as `OpRecord`: a stored trace's table
    unpickles as plain tuples (lazy.py), made where first read."""

    name: str
    depth: int
    params: int
    trainable_params: int
    activation_bytes: int
    flops_forward: float
    flops_backward: float


@dataclass
class TraceDerived:
    """What the prediction layers derive from one trace alone, made when first asked and kept
    with it (a real trace's replays are made where it is traced and stored with it: trace/
    store.py, derive/replays.py `prepare`). Never compared; a trace derived from another starts
    with an empty one (its own), except the replays of the same allocations (`share_replays`)."""

    # the caching allocator's replay of the trace's own events: rules name -> (peak allocated,
    # peak reserved, peak pinned) (derive/allocator.py)
    replay: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # rules name -> Fragmentation of this trace (a stitched one: its whole stack's)
    fragmentation: dict[str, object] = field(default_factory=dict)
    # a cut trace: rules name -> Fragmentation of the whole stack's replay (derive/replays.py)
    whole_fragmentation: dict[str, object] = field(default_factory=dict)
    # a stitched trace: the cut trace whose stack it repeats (its fragmentation is that one's
    # whole-stack replay), and whether that one's events repeat block by block
    whole_of: Trace | None = None
    repeats: bool | None = None
    # a trace read off a cut one by derive/stitch.py `extend`: what the block added
    extended: bool = False
    # (the cut trace, [its last block's ops, grown ops]: a list made where first read)
    one_more: tuple | None = None
    # a cut trace's last block's ops, their work (derive/stitch.py `block_ops`): made where the
    # trace is made (replays.py `prepare`); an interpolated trace's from its anchors' (`line`)
    block_ops: object | None = None
    line: tuple | None = None              # interpolated: (lo, hi, f) (derive/interpolate.py)
    # this trace with one block more (`extend`), made once: (made?, the trace or None)
    more: tuple[bool, Trace | None] = (False, None)
    op_table: object | None = None         # predict/optable.py `summarize`
    # a stitched trace: its ops as [base, block, k], the list base + block x k (stitch.py)
    ops_parts: list | None = None
    family: bytes | None = None            # derive/interpolate.py `family_key`

    def share_replays(self, src: TraceDerived) -> None:
        """Take `src`'s replays, made of the same allocations (the same step under other
        semantics or dtype names: derive/twins.py)."""
        for mine, theirs in ((self.replay, src.replay),
                             (self.whole_fragmentation, src.whole_fragmentation)):
            for k, v in theirs.items():
                mine.setdefault(k, v)


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
    ops: list                         # OpRecord, in the order they ran
    modules: list[ModuleRow]
    log: TraceLog                     # what phase_peaks is computed from (log.py)
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
    # the elements of the floating part (prepare.py `dtype_split`)
    packed_weight_bytes: int = 0
    floating_weight_elements: int = 0
    expert_param_bytes: int = 0       # MoE experts' parameters as stored (trace/moe.py)
    expert_trainable_bytes: int = 0
    moe_dispatch_elements: int = 0    # T x k x hidden over MoE layers: one all-to-all's payload
    hidden_size: int = 0              # the model's hidden size where it has one (0: unknown)
    stack: Stack | None = None        # traced with its repeated blocks cut (trace/stack.py)
    flash_eligible: int = 0           # SDPA calls flash would take (emulation.py `_sdpa`)
    sdpa_calls: int = 0               # attention calls whose kernel it chose (emulation.py)
    # a `py:` model's user code: each .py file loaded when the trace ended -> its SHA-256
    # (models/custom.py `user_files`); the store reads the trace back only while all are unchanged
    sources: dict[str, str] = field(default_factory=dict)
    # a cut trace's last block: what it adds to the totals above (tracer.py `_last_block`)
    last_block: dict[str, float] | None = None
    derived: TraceDerived = field(default_factory=TraceDerived, init=False, repr=False,
                                  compare=False)

    @property
    def flops_per_step(self) -> float:
        """Forward + backward FLOPs of one micro-batch (recomputation included)."""
        return sum(self.flops["forward"].values()) + sum(self.flops["backward"].values())

    @property
    def model_flops(self) -> float:
        """Forward + backward FLOPs without recomputation: the numerator of MFU."""
        return self.flops_per_step - self.recompute_flops


class OptimizerPart(NamedTuple):
    """What a job's optimizer does in a traced step apart from its forward and backward
    (tracer.py `trace_optimizer`): the memory log, events and event blocks up to the forward (the
    parameters made, then the warm-up step that makes the state), those of the update itself,
    its ops, and what the step's trace reads of its state. derive/swap.py reads a step with
    this optimizer off the same step traced with another."""

    log: TraceLog                  # marks as a step's: where the forward would begin, the
                                   # update begins, the gradients are freed
    ops: list                      # the update's (OpRecord)
    optimizer_state_bytes: int
    last_block_state_bytes: int    # of them, the cut stack's last block's (0: not cut)
    unknown_flop_ops: frozenset
    trace_seconds: float


@dataclass
class InferenceTrace:
    """One inference forward: `batch` sequences x `new_tokens` tokens against `context` cached.

    Duck-types what predict/optable.py `summarize` reads from a training Trace, so its op table and
    op_times serve generation unchanged."""

    model: str
    batch_size: int
    new_tokens: int
    context: int
    semantics: KernelSemantics
    ops: list[OpRecord]
    params_total: int
    weight_bytes: int            # parameters + buffers as stored
    kv_cache_bytes: int          # K/V held by the cache after the forward (context + new tokens)
    peak_bytes: int              # live-memory peak during the forward (weights + cache included)
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    trace_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # traced with the stack cut (`trace_forward`'s depth): what the whole stack is read off
    stack: Stack | None = None
    log: TraceLog = field(default_factory=TraceLog)     # kept where cut: what is repeated
    last_block: dict[str, int] | None = None
    derived: TraceDerived = field(default_factory=TraceDerived, init=False, repr=False,
                                  compare=False)
    # what summarize() reads from a training trace; an inference forward has none of these
    gradient_bytes: int = 0
    params_trainable: int = 0
    moe_dispatch_elements: int = 0

    @property
    def flops(self) -> float:
        return float(sum(o.flops for o in self.ops))

    @property
    def bytes_moved(self) -> float:
        return float(sum(o.bytes for o in self.ops))

    @property
    def transient_bytes(self) -> int:
        """Peak beyond weights and the final cache: activations, logits, cache concatenation."""
        return max(0, self.peak_bytes - self.weight_bytes - self.kv_cache_bytes)

    # --- summarize()'s view of a training trace -------------------------------------------
    model_flops = flops
    largest_block_param_bytes = property(lambda self: self.weight_bytes)
    tokens_per_sample = property(lambda self: self.new_tokens)


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int,
                   dtype_bytes: int) -> int:
    """K and V of every layer for `tokens` cached tokens (summed over sequences):
    2 x layers x kv_heads x head_dim x tokens x bytes per element (Pope et al. 2022, sec. 2)."""
    return 2 * layers * kv_heads * head_dim * tokens * dtype_bytes
