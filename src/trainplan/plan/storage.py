"""Checkpoint size and how many checkpoints a platform's output disk and file limit hold.

A checkpoint that resumes training holds what the next session cannot rebuild:

    full training:  all weights as stored (fp32 masters under AMP, 16-bit in pure fp16/bf16)
                    + optimizer state (AdamW: 2 fp32 moments per trainable parameter)
    LoRA / QLoRA:   the adapters and their optimizer state only; the frozen base is reloaded
                    from the hub (PEFT's `save_pretrained` writes the adapters alone)

Both are read from the trace (`weight_bytes`, `trainable_param_bytes`, `optimizer_state_bytes`),
so they follow the job's precision, optimizer (8-bit AdamW: 2 bytes per parameter) and LoRA.
The learning-rate scheduler, RNG state and step counter are a few KiB and ignored.

Files per checkpoint: `torch.save` of one dict is 1 file. A sharded optimizer saves per rank;
DeepSpeed's layout is one `*_optim_states.pt` per rank plus the model states (one file under
ZeRO-1/2, one per rank under ZeRO-3) plus a `latest` tag; FSDP's sharded state dict likewise writes
per rank. So: zero1/zero2 -> devices + 2, zero3/fsdp -> 2 x devices + 1.
"""
from __future__ import annotations

from ..strategy import Strategy


def checkpoint_parts(trace, lora: bool) -> tuple[int, int]:
    """(weights bytes, optimizer state bytes) a resumable checkpoint stores."""
    weights = trace.trainable_param_bytes if lora else trace.weight_bytes
    return int(weights), int(trace.optimizer_state_bytes)


def files_per_checkpoint(strategy: Strategy, devices: int) -> int:
    """1 for an unsharded state dict; per-rank shards for ZeRO / FSDP (see module docstring)."""
    if devices <= 1 or strategy.replicated:
        return 1
    if not strategy.shards_weights:
        return devices + 2
    return 2 * devices + 1


def checkpoints_that_fit(checkpoint_bytes: int, disk_bytes: int | None) -> int | None:
    """floor(disk / checkpoint); None when the platform states no disk limit."""
    if disk_bytes is None:
        return None
    return disk_bytes // max(1, checkpoint_bytes)


def checkpoints_within_file_limit(files: int, output_file_limit: int | None) -> int | None:
    """floor(file limit / files per checkpoint); None without a stated file limit."""
    if output_file_limit is None:
        return None
    return output_file_limit // max(1, files)
