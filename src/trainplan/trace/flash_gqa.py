"""Grouped-query attention on the flash kernel, as the GPU runs it: K/V heads not expanded.

`F.scaled_dot_product_attention(..., enable_gqa=True)` with fewer K/V heads than query heads
(Llama 3, Mistral, Qwen2.5: transformers passes it wherever the batch has no mask) reaches the
flash backend with K/V as they are: its CUDA branch only pads the head dim before calling
`_scaled_dot_product_flash_attention` (aten/src/ATen/native/transformers/attention.cpp,
`scaled_dot_product_attention`, case flash_attention); only the math path expands them
(`pre_process_group_query_attention_input`, a `repeat_interleave`). FlashAttention-2 reads
each K/V head for its group of query heads (flash_api.cpp `mha_fwd`: num_heads_k), so the
forward neither copies K/V nor keeps expanded copies for the backward: the saved K/V are the
model's. The backward does allocate expanded gradients: `mha_bwd` writes dK and dV for every
query head into (batch, seqlen_k, num_heads, head_dim) buffers and sums each group into the
(num_heads_k) gradients (`dk_expanded`, `dv_expanded`, `at::sum_out` over the group).

`gqa_flash` runs that on the fake device: the flash op on the grouped K/V, and a backward that
allocates the expanded gradients and sums them per group, so the trace holds the kernel's
transient and its reduction, and no forward copy.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


class _GqaFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dropout_p, is_causal, scale):
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = \
            aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False,
                                                     scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, seed, offset)
        ctx.args = (cum_q, cum_k, max_q, max_k, dropout_p, is_causal, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, seed, offset = ctx.saved_tensors
        cum_q, cum_k, max_q, max_k, dropout_p, is_causal, scale = ctx.args
        dq, _, _ = aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed,
            offset, scale=scale)
        b, hk, s, d = k.shape
        group = q.shape[1] // hk
        grads = []
        for t in (k, v):
            expanded = t.new_empty((b, hk * group, s, d))       # mha_bwd's dk/dv_expanded
            grads.append(expanded.view(b, hk, group, s, d).sum(2))
        return dq, grads[0], grads[1], None, None, None


def gqa_flash(q, k, v, dropout_p: float = 0.0, is_causal: bool = False, scale=None):
    """Flash attention of `q` (b, h, s_q, d) over grouped `k`, `v` (b, h_kv, s_k, d), h a
    multiple of h_kv (module docstring): the output, (b, h, s_q, d)."""
    return _GqaFlash.apply(q, k, v, dropout_p, is_causal, scale)
