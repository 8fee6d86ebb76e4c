"""Alike attention windows traced as one call: Qwen-VL's vision tower, window by window.

Qwen2.5-VL's vision tower attends within windows (a 560 px image: 25 windows of 64 patches, in 28
of its 32 blocks) and, in the other blocks, within each image. Except under flash-attention-2,
transformers runs that as a Python loop (modeling_qwen2_5_vl.py, Qwen2_5_VLVisionAttention and
Qwen2-VL's VisionAttention: "Process each chunk separately"):

    splits = [torch.split(t, lengths.tolist(), dim=2) for t in (q, k, v)]
    outs = [attention_interface(self, q, k, v, ...)[0] for q, k, v in zip(*splits)]
    attn_output = torch.cat(outs, dim=1)

so a traced step dispatched one attention call per window, forward, in the rerun of a
checkpointed block and in backward: 2,112 of a chart-rvr step's 9,299 ops and, with the views
around them, most of its tracing time (python scripts/window_cost.py, 2 cores, 2026-11-28: a
micro-batch-1 step on a T4's kernels 6.06 s with the loop, 3.62 s batched; micro-batch 2 on an
A100's, 50 windows, 9.60 s and 3.66 s).

Where every window has the same length, the call runs a fused SDPA kernel (flash or
memory-efficient: one kernel a call each way) and autocast casts nothing on the way (a cast is
an op per window; under AMP the loop is traced as it is), the n windows are the same kernel n
times on equal shapes. `torch.split` of q, k and v is then answered with one view of each as n
windows side by side ([1, H, n w, D] -> [n, H, w, D]: no copy), the loop runs once, the
attention kernel runs once on the n windows, and `torch.cat` of its one output copies the same
bytes into the same [n w, H D] layout that the loop's cat of n outputs wrote. The counter
(counters.py) records that kernel, and its backward, as the n calls the GPU runs: FLOPs, bytes
and the batch dimension of its shape divided by n, so the time model sees the loop's kernels.

The allocations are the loop's too (counters.py `track_windows`): each output over the windows
is logged as the loop's n allocations, call by call, each window's share ([1, H, w, D] of
[n, H, w, D]), and a per-call output (the philox seed and offset) once per window; its free
frees all n. What is not the loop's: those n frees come together where the loop's interleave
with the next windows' allocations, and the host dispatches a few view ops fewer or more (the
batched view, the gradient's cut; within 1% of the step's host ops). Checked against the loop
(tests/test_windows.py): the same ops, bytes, allocations and peaks; chart-rvr's plan is the same
field for field as with the loop (tests/test_golden.py) and took 47.8 s cold against 97.4 s
(2 cores, 2026-11-28).

The loop is recognised by its source (`_LOOP`), once per class; any other version of the code
(flash-attention's cu_seqlens call, an older block-diagonal mask) is traced as it is.
"""
from __future__ import annotations

import functools
import inspect

import torch

# the per-window loop as transformers writes it (read in transformers 5.24)
_LOOP = "torch.split(tensor, lengths.tolist(), dim=2)"
SPLITS = frozenset({torch.split, torch.Tensor.split, torch.functional.split})


@functools.cache
def _loops(cls) -> bool:
    """Whether `cls.forward` attends window by window in the loop above."""
    try:
        return _LOOP in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


class WindowBatch:
    """The window loop of the modules it is installed on (`install`), batched as the module
    docstring says. `active`: inside such a module's forward; `n`: windows of the call under way
    (0 when none), read by the counter to split that call's attention records."""

    def __init__(self, counter):
        self.counter = counter
        self.active = 0

    def split(self, backend, func, args, kwargs):
        """`torch.split(t, sizes, dim)` answered as one batched view, or None (not batched)."""
        if not self.active:
            return None
        t = args[0]
        sizes = args[1] if len(args) > 1 else kwargs.get("split_size_or_sections",
                                                         kwargs.get("split_size"))
        dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
        if not (isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[0] == 1 and dim == 2
                and isinstance(sizes, (list, tuple)) and len(sizes) > 1
                and len(set(sizes)) == 1 and sum(sizes) == t.shape[2]):
            return None
        if backend(t) not in ("flash", "efficient"):
            return None
        n, w = len(sizes), sizes[0]
        c = self.counter
        c.window_batch = n
        out = [_Windows.apply(t, n, w)]
        c.window_views = c.host_pending       # views since the last kernel: the loop's too
        c.window_extra += _EXTRA_VIEWS
        return out

    def joined(self, tensors=()) -> None:
        """The loop's `torch.cat` of `tensors`: the batched call is over. The views dispatched
        after its kernel the loop dispatches after every window's, before the next window's
        kernel. In backward the cat's gradient reaches the batched output once the loop's would
        have been cut in n (a hook notes the host ops dispatched so far, `_per_window`)."""
        c = self.counter
        if c.window_records is not None:
            start, n = c.window_records
            c.records[start + 1:start + n] = [r.copied(host_ops=r.host_ops + c.host_pending)
                                              for r in c.records[start + 1:start + n]]
            if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and \
                    tensors[0].requires_grad:
                tensors[0].register_hook(self._reached)
        c.window_batch, c.window_records, c.window_extra = 0, None, 0

    def _reached(self, grad) -> None:
        self.counter.window_views = self.counter.host_pending


# the batched view (`_Windows`) is three view ops (squeeze, unflatten, transpose), the loop's
# split one (split_with_sizes): what the first window's record does not count
_EXTRA_VIEWS = 2


class _Windows(torch.autograd.Function):
    """t [1, H, n w, D] as n windows side by side, [n, H, w, D] (a view). Backward is the
    loop's: `torch.split`'s backward concatenates the n windows' gradients into a new tensor
    (one cat kernel over the same bytes, the same allocation)."""

    @staticmethod
    def forward(ctx, t, n: int, w: int):
        return t.squeeze(0).unflatten(1, (n, w)).transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        return torch.cat(grad.unbind(0), dim=1).unsqueeze(0), None, None


def install(model: torch.nn.Module, batch: WindowBatch) -> int:
    """Mark the forward of every module of `model` whose class runs the window loop on SDPA
    (`_loops`) for `batch`; how many there are."""
    found = 0
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if not _loops(type(mod)) or getattr(cfg, "_attn_implementation", None) != "sdpa":
            continue

        def enter(m, args, kwargs):
            batch.active += 1

        def leave(m, args, kwargs, out):
            batch.active -= 1
            batch.joined()

        mod.register_forward_pre_hook(enter, with_kwargs=True)
        mod.register_forward_hook(leave, with_kwargs=True)
        found += 1
    return found
