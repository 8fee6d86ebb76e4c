"""The processes of one training run (torchrun, accelerate, the Trainer under either): which one
this is, and the few collectives the guard needs to agree.

With a process group (torch.distributed initialised, more than one process) the collectives
are torch.distributed's; on NCCL the small tensors live on this process's current CUDA device.
Without one, the rank is the one torchrun put in $RANK (so only rank 0 writes even when the
script never joins a group) and each collective returns its input.
"""
from __future__ import annotations

import os

import torch

from .disk import GuardError

NO, SAVE, STOP_DEADLINE, STOP_SIGNAL = 0, 1, 2, 3       # the per-step decision, agreed by max


def attempt(fn):
    """fn()'s result, or the exception it raised: an error on one rank is handed to the others
    with the next collective, and raised on every rank (none is left waiting)."""
    try:
        return fn()
    except Exception as e:
        return e


class Ranks:
    @staticmethod
    def group():
        """torch.distributed when a process group of more than one process is up, else None."""
        try:
            import torch.distributed as dist
        except ImportError:        # pragma: no cover
            return None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist
        return None

    @property
    def rank(self) -> int:
        d = self.group()
        return d.get_rank() if d else int(os.environ.get("RANK") or 0)

    @property
    def world(self) -> int:
        d = self.group()
        return d.get_world_size() if d else 1

    def max(self, value: int) -> int:
        """The largest `value` over the ranks. Every rank calls it, so it is also a barrier."""
        d = self.group()
        if d is None:
            return int(value)
        dev = (torch.device("cuda", torch.cuda.current_device())
               if str(d.get_backend()) == "nccl" else torch.device("cpu"))
        t = torch.tensor([int(value)], dtype=torch.int64, device=dev)
        d.all_reduce(t, op=d.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        d = self.group()
        if d is None:
            return [obj]
        out = [None] * d.get_world_size()
        d.all_gather_object(out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        d = self.group()
        if d is None:
            return obj
        box = [obj]
        d.broadcast_object_list(box, src=0)
        return box[0]

    def agree_ok(self, err: Exception | None, what: str) -> None:
        """Raise on every rank when any rank failed: its own error where it has one."""
        if self.max(int(err is not None)):
            raise err or GuardError(f"{what} failed on another rank (its log says why)")
