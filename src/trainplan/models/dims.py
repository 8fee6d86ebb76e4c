"""A reference transformer's dimensions (`transformer:` jobs, spec.py): the sizes and choices
models/reference.py builds its module from, kept apart from it so that reading a job does not
import PyTorch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformerDims:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int | None = None      # default 4h
    vocab_size: int = 32000
    num_kv_heads: int | None = None
    kind: str = "encoder"                      # encoder | decoder
    norm: str = "layernorm"                    # layernorm | rmsnorm
    activation: str = "gelu"                   # gelu | swiglu
    positional_encoding: str = "learned"       # learned | rotary | alibi
    max_position_embeddings: int = 4096
    tie_embeddings: bool = True
    dropout: float = 0.1
    bias: bool = True
    # the loss kernels: "torch" (F.cross_entropy: log-softmax and NLL as separate passes over the
    # logits, in fp32 under autocast; a causal LM shifts the logits) or "fused" (one kernel a
    # pass, the labels shifted instead: models/fused_loss.py, llm-foundry's MPT default)
    loss: str = "torch"

    @property
    def ffn(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size
