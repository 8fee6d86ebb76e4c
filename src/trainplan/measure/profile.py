"""Where a measured step's device time goes: one more optimizer step under PyTorch's profiler,
its kernels summed by the time model's kernel classes (`measure --profile`).

Each kernel is charged to the aten op that launched it (the profiler's `self_device_time_total`
of that op: a cuBLAS GEMM to `aten::mm`, a cuDNN convolution to `aten::cudnn_convolution`, a
FlashAttention kernel to `aten::_flash_attention_forward`), and the op's name gives its class
(predict/timing.py `op_name_class`); every op the optimizer phase ran (gradient clipping,
GradScaler's unscale, the update, zero_grad: the step's own `trainplan.optimizer` range) is the
optimizer's. Kernels no op launched are `elementwise` (other). The device's busy time is the sum
of every kernel, copy and memset on it; what the step takes beyond that (the timed steps' median,
not the profiled step's, which the profiler's own host work slows) is time the device sat idle:
waiting for the host to issue kernels, or for a synchronisation. That separates a kernel the
model times wrong from a host the model times wrong, which the step time alone cannot.

On the CPU the host is the device: an op's time is its own CPU time (dispatch included), and
nothing is idle but the Python between ops.
"""
from __future__ import annotations

import contextlib
import os
import sys

import torch

from ..predict.timing import K_OPTIM, KERNEL_CLASS_NAMES, op_name_class

OPTIMIZER_RANGE = "trainplan.optimizer"
TOP_OPS = 12                     # the ops with the most device time, kept in the record


def phase(name: str):
    """A profiler range around one part of the profiled step (`OPTIMIZER_RANGE` for the
    optimizer's) while a profiler runs; nothing in the timed steps, which a range's own dispatch
    would slow."""
    return (torch.profiler.record_function(name) if torch.autograd._profiler_enabled()
            else contextlib.nullcontext())


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto writes a line to the process's stderr (file descriptor 2, below Python) as the
    profiler starts and stops; keep it out of the report. Only around start and stop: what the
    step itself says still shows."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _device_us(e, on_cpu: bool) -> float:
    if on_cpu:
        return float(e.self_cpu_time_total)
    t = getattr(e, "self_device_time_total", None)
    return float(t if t is not None else e.self_cuda_time_total)


def _in_optimizer(e) -> bool:
    p = e
    while p is not None:
        if p.name == OPTIMIZER_RANGE or p.name.startswith("Optimizer."):
            return True
        p = p.cpu_parent
    return False


def profiled_step(step, dev: torch.device) -> dict | None:
    """Run `step()` (one optimizer step, its optimizer part inside `phase(OPTIMIZER_RANGE)`)
    under the profiler; return the device seconds by kernel class, the device's busy seconds and
    the ops with the most device time (module docstring). None where the profiler saw no kernel
    on a CUDA device (no CUPTI in this PyTorch build or driver: nothing to compare)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    on_cpu = dev.type != "cuda"
    acts = [ProfilerActivity.CPU] + ([] if on_cpu else [ProfilerActivity.CUDA])
    prof = profile(activities=acts)
    with _quiet_stderr():
        prof.start()
    try:
        step()
        if not on_cpu:
            torch.cuda.synchronize(dev)
    finally:
        with _quiet_stderr():
            prof.stop()
    events = prof.events()
    by_class = dict.fromkeys(KERNEL_CLASS_NAMES, 0.0)
    per_op: dict[str, list] = {}
    attributed = 0.0
    for e in events:
        if e.device_type != DeviceType.CPU or not e.name.startswith("aten::"):
            continue
        us = _device_us(e, on_cpu)
        if us <= 0:
            continue
        cls = K_OPTIM if _in_optimizer(e) else op_name_class(e.name)
        by_class[KERNEL_CLASS_NAMES[cls]] += us * 1e-6
        attributed += us
        tot = per_op.setdefault(e.name, [0.0, 0, KERNEL_CLASS_NAMES[cls]])
        tot[0] += us * 1e-6
        tot[1] += 1
    if on_cpu:
        busy = attributed
    else:
        busy = sum(e.time_range.elapsed_us() for e in events
                   if e.device_type == DeviceType.CUDA)
        if busy <= 0:
            return None
        by_class["elementwise"] += max(0.0, busy - attributed) * 1e-6
    top = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
    by_class.pop("depthwise")          # a name cannot tell one (op_name_class): it is a conv
    return {"device_s": busy * 1e-6, "by_class_s": by_class,
            "top_ops": [{"op": n, "device_s": t, "calls": c, "class": k}
                        for n, (t, c, k) in top],
            "device": "cpu (an op's own CPU time)" if on_cpu else "cuda kernels"}
