"""What a transformers model's own code costs the host per kernel, by path, on this CPU.

Run: python scripts/host_paths.py

scripts/host_dispatch.py measures PyTorch's dispatch by path on bare functional ops; the time
model's host costs (predict/host.py) are built from those, times one fitted scale. This measures
the same paths through a real transformers decoder (Qwen2's code: 24 layers, hidden 64, so the
kernels cost next to nothing on the CPU and what is timed is the host's work): a training
forward under autograd, its backward, and a decode step of `generate` (no grad, KV cache,
greedy), each as seconds per kernel dispatched (the views and other kernel-less ops between
kernels included in the time, counted apart). Best of 20 (generate: of 5, per token between 16
and 64 new tokens). docs/validation.md ("Generation against published decode throughput") says
what it shows.
"""
from __future__ import annotations

import sys
import time

sys.modules.setdefault("torchvision", None)    # transformers' optional import; not needed here

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

VIEWS = frozenset({"view", "t", "transpose", "unsqueeze", "expand", "permute", "_unsafe_view",
                   "detach", "alias", "as_strided", "slice", "select", "squeeze", "reshape",
                   "_reshape_alias", "split", "unbind", "split_with_sizes", "chunk"})


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels = self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in VIEWS:
            self.views += 1
        else:
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def _best(fn, n: int = 20) -> float:
    fn()
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=24,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=256,
                      attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg)
    ids = torch.randint(0, 256, (1, 8))

    def forward():
        return model(input_ids=ids, labels=ids).loss

    def step():
        forward().backward()

    fwd = Count()
    with fwd:
        loss = forward()
    bwd = Count()
    with bwd:
        loss.backward()
    t_f = _best(forward)
    t_b = _best(step) - t_f
    model.eval()

    def generate(n):
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    per_token = (_best(lambda: generate(64), 5) - _best(lambda: generate(16), 5)) / 48
    dec = Count()
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        with dec:
            model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
    rows = (("training forward", t_f, fwd), ("backward", t_b, bwd),
            ("decode step (generate)", per_token, dec))
    for name, seconds, c in rows:
        print(f"{name:24s} {seconds * 1e3:6.2f} ms  {c.kernels:5d} kernels {c.views:5d} views  "
              f"{seconds / c.kernels * 1e6:6.2f} us a kernel ({seconds / c.kernels / (t_f / fwd.kernels):.2f} "
              f"of a forward kernel)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
