"""A fused cross-entropy kernel: the reference transformer's `loss: fused` (models/reference.py).

PyTorch's `F.cross_entropy` under autocast runs as separate kernels over the (tokens x vocab)
logits: a cast of the 16-bit logits to fp32 (autocast puts log_softmax on its fp32 list), the
log-softmax, the NLL gather, and in the backward the NLL and log-softmax gradients and the cast
back, each a full pass over tokens x vocab elements (and for a causal LM the copy of the shifted
logits, `logits[:, :-1]`). A fused kernel reads the logits once in the forward, keeping only
the log-sum-exp of each row, and once in the backward, writing the gradient of the logits in
their own dtype: FlashAttention's `flash_attn.losses.cross_entropy.CrossEntropyLoss` (the
xentropy kernel of Dao-AILab/flash-attention `csrc/xentropy`, llm-foundry's MPT default
`loss_fn: fused_crossentropy`, llmfoundry/models/mpt/modeling_mpt.py), Liger's and Apple's
cut cross-entropy are of this kind. At 50,368 vocabulary entries that is about 6 bytes an
element against PyTorch's about 48 (MPT-125m at 65,536 tokens a micro-batch: 20 GB against
158 GB).

The two kernels are custom ops (`torch.library.custom_op`), so the tracer sees and times each as
one kernel moving its tensors' bytes (trace/counters.py). They compute the real loss on real
tensors (tests/test_fused_loss.py checks them against `F.cross_entropy`).
"""
from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("trainplan::fused_cross_entropy", mutates_args=())
def fused_cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """(each row's loss, fp32, 0 where the label is `ignore_index`; each row's log-sum-exp) of
    `logits` (rows x vocab) against `labels` (rows)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    keep = labels != ignore_index
    picked = x.gather(1, torch.where(keep, labels, 0)[:, None])[:, 0]
    return torch.where(keep, lse - picked, 0.0), lse


@fused_cross_entropy.register_fake
def _(logits: Tensor, labels: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    rows = logits.shape[0]
    return (logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty(rows, dtype=torch.float32))


@torch.library.custom_op("trainplan::fused_cross_entropy_backward", mutates_args=())
def fused_cross_entropy_backward(grad: Tensor, logits: Tensor, lse: Tensor, labels: Tensor,
                                 ignore_index: int) -> Tensor:
    """The gradient of the logits, in their dtype: (softmax - one-hot) x the row's gradient."""
    keep = labels != ignore_index
    g = torch.exp(logits.float() - lse[:, None])
    g.scatter_add_(1, torch.where(keep, labels, 0)[:, None],
                   -torch.ones_like(lse)[:, None])
    return (g * torch.where(keep, grad, 0.0)[:, None]).to(logits.dtype)


@fused_cross_entropy_backward.register_fake
def _(grad: Tensor, logits: Tensor, lse: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    return torch.empty_like(logits)


def _setup(ctx, inputs, output) -> None:
    logits, labels, ignore_index = inputs
    ctx.save_for_backward(logits, output[1], labels)
    ctx.ignore_index = ignore_index


def _backward(ctx, grad_loss: Tensor, _grad_lse: Tensor):
    logits, lse, labels = ctx.saved_tensors
    return (fused_cross_entropy_backward(grad_loss, logits, lse, labels, ctx.ignore_index),
            None, None)


fused_cross_entropy.register_autograd(_backward, setup_context=_setup)


def cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int = -100) -> Tensor:
    """The mean loss over the labels that count, as FlashAttention's CrossEntropyLoss reduces it:
    `logits` (..., vocab), `labels` (...)."""
    flat = labels.reshape(-1)
    loss, _ = fused_cross_entropy(logits.reshape(-1, logits.shape[-1]), flat, ignore_index)
    return loss.sum() / (flat != ignore_index).sum()
