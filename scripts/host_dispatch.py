"""What eager PyTorch's host spends per op, by who issues it: measured on this machine's CPU.

The step-time model's host/device queue (src/trainplan/predict/host.py) charges each kernel a
host time that depends on who issues it: a forward op under autograd (the graph recorded), a
backward op (autograd's C++ engine), a no-grad forward (generation), and each kernel-less op
(a view) before it. Their absolute size depends on the CPU (and, on a GPU, the CUDA launch) and
is fitted on host-bound GPU steps (scripts/calibrate_time.py: `host_forward_s`); their RATIOS
are a property of PyTorch's dispatch paths, measured here on the CPU with tensors so small that
the kernels themselves cost next to nothing:

* forward: a transformer-like block of small ops (linear, add, mul, gelu, layer_norm, softmax,
  matmul) with parameters that require grad, per op dispatched;
* inference: the same under torch.no_grad();
* backward: loss.backward() of that graph, per kernel the backward dispatches (counted once by a
  TorchDispatchMode, timed without it);
* view: t.view / transpose / unsqueeze calls.

Writes the ratios to stdout as JSON; scripts/calibrate_time.py reads them from
efficiency.json's `host_ratios` (copied there with this script's date and machine).

    PYTHONPATH=src python scripts/host_dispatch.py [--repeat 200]
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from trainplan.measure.device import cpu_model


# ops that launch no kernel: views and aliases
VIEWS = frozenset({"view", "t", "transpose", "unsqueeze", "expand", "permute", "_unsafe_view",
                   "detach", "alias", "as_strided", "slice", "select", "squeeze"})


class Count(TorchDispatchMode):
    """Counts the ops dispatched under it: `views` (by name, `view_names`), the rest `kernels`."""

    def __init__(self, view_names: frozenset = VIEWS):
        super().__init__()
        self.view_names = view_names
        self.kernels = self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.split(".")[0] in self.view_names:
            self.views += 1
        else:
            self.kernels += 1
        return out


def _block(x, w1, b1, w2, b2, g, be):
    h = F.linear(x, w1, b1)
    h = F.gelu(h)
    h = F.linear(h, w2, b2)
    h = h + x
    h = F.layer_norm(h, h.shape[-1:], g, be)
    a = torch.matmul(h, h.transpose(-1, -2))
    a = torch.softmax(a * 0.125, dim=-1)
    return torch.matmul(a, h) * 0.5


def _params(d: int, grad: bool):
    def p(*shape):
        return torch.randn(*shape).requires_grad_(grad)
    return p(2 * d, d), p(2 * d), p(d, 2 * d), p(d), p(d), p(d)


def best(fn, repeat: int) -> float:
    """The least seconds of `repeat` calls of `fn`, after one to warm up."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def view_seconds(repeat: int, d: int = 8) -> float:
    """The least seconds a view op takes: 100 rounds of view, transpose and unsqueeze."""
    v = torch.randn(2, 4, d)

    def views():
        for _ in range(100):
            v.view(8, d).transpose(0, 1).unsqueeze(0)
    return best(views, repeat) / 300


def measure(repeat: int = 200, d: int = 8, blocks: int = 8) -> dict:
    torch.set_num_threads(1)
    x = torch.randn(2, 4, d)
    params = [_params(d, True) for _ in range(blocks)]

    def forward():
        h = x
        for ps in params:
            h = _block(h, *ps)
        return h.sum()

    with Count() as c:
        loss = forward()
    fwd_kernels, fwd_views = c.kernels, c.views
    with Count() as c:
        loss.backward()
    bwd_kernels = c.kernels + c.views

    t_fwd = best(forward, repeat)
    with torch.no_grad():
        t_inf = best(forward, repeat)

    def fwd_bwd():
        forward().backward()
    t_both = best(fwd_bwd, repeat)
    t_bwd = max(t_both - t_fwd, 0.0)
    t_view = view_seconds(repeat, d)
    # a forward op's cost net of the views it dispatched (each a view's cost)
    per_fwd = (t_fwd - fwd_views * t_view) / fwd_kernels
    per_inf = (t_inf - fwd_views * t_view) / fwd_kernels
    return {
        "date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
        "cpu": cpu_model(), "torch": torch.__version__, "repeat": repeat,
        "forward_kernels": fwd_kernels, "forward_views": fwd_views,
        "backward_kernels": bwd_kernels,
        "forward_op_s": per_fwd, "inference_op_s": per_inf, "backward_op_s": t_bwd / bwd_kernels,
        "view_s": t_view,
        "ratios": {"backward": t_bwd / bwd_kernels / per_fwd, "inference": per_inf / per_fwd,
                   "view": t_view / per_fwd},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    print(json.dumps(measure(args.repeat), indent=1))


if __name__ == "__main__":
    main()
