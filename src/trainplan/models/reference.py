"""Our own small reference transformer, for models described by their dimensions (`transformer:`).

Covers what the seeds describe: encoder (bidirectional, masked-LM head) or decoder (causal LM);
LayerNorm or RMSNorm; GELU MLP (h -> ffn -> h) or SwiGLU (gate and up h -> ffn, down ffn -> h);
learned, rotary (RoPE) or ALiBi positions; tied input/output embeddings. Attention goes through
`F.scaled_dot_product_attention`, so the tracer's target semantics choose the kernel; ALiBi passes
its slopes as an additive bias (Press et al. 2022), which rules out FlashAttention and selects the
memory-efficient kernel, as it does in PyTorch. The loss is `F.cross_entropy` over the shifted
logits, or with `loss: fused` one fused kernel a pass over the logits with the labels shifted
instead (models/fused_loss.py), as llm-foundry's MPT trains.

Weights start as GPT-2's and BERT's do (normal, std 0.02; biases 0, norms 1: transformers'
`initializer_range` default): with PyTorch's own N(0, 1) embedding, tied to the head, an
encoder's logits lean on each position's own token by hundreds and the measured loss starts in
the hundreds. Only `trainplan measure` sees values; a trace is the same either way.

Parameters per layer (no biases when `bias=False`): attention 4h^2 (+ GQA shrinks K, V);
GELU MLP 2 h f; SwiGLU 3 h f; two norms 2h (LayerNorm 4h with bias).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fused_loss
from .dims import TransformerDims


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(d: TransformerDims) -> nn.Module:
    return RMSNorm(d.hidden_size) if d.norm == "rmsnorm" else nn.LayerNorm(d.hidden_size, bias=d.bias)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def alibi_slopes(n_heads: int) -> list[float]:
    """Geometric slopes 2^(-8 i / n) of Press et al. (for n a power of two; interleaved otherwise)."""
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    if math.log2(n_heads).is_integer():
        return pow2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return pow2(closest) + pow2(2 * closest)[0::2][: n_heads - closest]


class Attention(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.d = d
        self.head_dim = d.hidden_size // d.num_heads
        kv = d.num_kv_heads or d.num_heads
        self.q_proj = nn.Linear(d.hidden_size, d.num_heads * self.head_dim, bias=d.bias)
        self.k_proj = nn.Linear(d.hidden_size, kv * self.head_dim, bias=d.bias)
        self.v_proj = nn.Linear(d.hidden_size, kv * self.head_dim, bias=d.bias)
        self.o_proj = nn.Linear(d.num_heads * self.head_dim, d.hidden_size, bias=d.bias)

    def qkv(self, x, rope=None):
        """Queries, keys and values (B, heads, T, head_dim), rotary positions applied."""
        b, s, _ = x.shape                                             # (B, T, C)
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def forward(self, x, rope=None, bias=None):
        b, s, _ = x.shape
        q, k, v = self.qkv(x, rope)
        causal = self.d.kind == "decoder"
        if bias is not None and causal:
            causal_mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
            bias = bias + causal_mask
            causal = False
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=self.d.dropout if self.training else 0.0,
            is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
        y = y.transpose(1, 2).reshape(b, s, -1)
        return F.dropout(self.o_proj(y), self.d.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.d = d
        if d.activation == "swiglu":
            self.gate_proj = nn.Linear(d.hidden_size, d.ffn, bias=d.bias)
        self.up_proj = nn.Linear(d.hidden_size, d.ffn, bias=d.bias)
        self.down_proj = nn.Linear(d.ffn, d.hidden_size, bias=d.bias)

    def forward(self, x):
        if self.d.activation == "swiglu":
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        else:
            h = F.gelu(self.up_proj(x))
        return F.dropout(self.down_proj(h), self.d.dropout, self.training)


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)); x + mlp(norm(x))."""

    def __init__(self, d: TransformerDims):
        super().__init__()
        self.input_norm = _norm(d)
        self.attn = Attention(d)
        self.post_attention_norm = _norm(d)
        self.mlp = MLP(d)

    def forward(self, x, rope=None, bias=None):
        x = x + self.attn(self.input_norm(x), rope, bias)
        return x + self.mlp(self.post_attention_norm(x))


INIT_STD = 0.02        # GPT-2's and BERT's initializer_range


@torch.no_grad()
def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=INIT_STD)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


class ReferenceTransformer(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.d = d
        self.embed_tokens = nn.Embedding(d.vocab_size, d.hidden_size)
        if d.positional_encoding == "learned":
            self.embed_positions = nn.Embedding(d.max_position_embeddings, d.hidden_size)
        self.layers = nn.ModuleList(Block(d) for _ in range(d.num_layers))
        self.norm = _norm(d)
        self.lm_head = nn.Linear(d.hidden_size, d.vocab_size, bias=False)
        if d.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.apply(_init_weights)

    def forward(self, input_ids, labels=None):
        b, s = input_ids.shape
        x = self.embed_tokens(input_ids)
        rope = bias = None
        pos = torch.arange(s, device=input_ids.device)
        if self.d.positional_encoding == "learned":
            x = x + self.embed_positions(pos)
        elif self.d.positional_encoding == "rotary":
            hd = self.d.hidden_size // self.d.num_heads
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=x.device).float() / hd))
            freqs = torch.outer(pos.float(), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            rope = (emb.cos().to(x.dtype), emb.sin().to(x.dtype))
        elif self.d.positional_encoding == "alibi":
            slopes = torch.tensor(alibi_slopes(self.d.num_heads), device=x.device)
            rel = (pos[None, :] - pos[:, None]).abs().float()         # (T, T)
            bias = (-slopes[:, None, None] * rel)[None]               # (1, nh, T, T)
        x = F.dropout(x, self.d.dropout, self.training)
        for layer in self.layers:
            x = layer(x, rope, bias)
        logits = self.lm_head(self.norm(x))                           # (B, T, V)
        if labels is None:
            return logits
        if self.d.loss == "fused":
            if self.d.kind == "decoder":     # the labels move, not the logits (llm-foundry)
                labels = torch.roll(labels, -1, dims=1)
                labels[:, -1] = -100
            return fused_loss.cross_entropy(logits, labels)
        if self.d.kind == "decoder":
            logits, labels = logits[:, :-1], labels[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
