"""`transformer` source: the reference module built from the job's dimensions."""
from __future__ import annotations

import torch

from ..errors import TrainplanError
from . import ModelBundle, masked_lm_batch
from .meta import on_meta
from .reference import ReferenceTransformer, TransformerDims


def build_reference(job) -> ModelBundle:
    d: TransformerDims | None = job.transformer
    if d is None:
        raise TrainplanError("Model 'transformer' needs its dimensions.",
                             fix="add a `model:` block with hidden_size, num_layers, num_heads "
                                 "(see examples/graphmer-se.yaml)")
    seq = job.seq_len or 512
    with on_meta():
        module = ReferenceTransformer(d)

    def make_inputs(batch: int):
        ids = torch.randint(0, d.vocab_size, (batch, seq))
        if d.kind == "decoder":            # the model shifts them: the next token is the label
            return {"input_ids": ids, "labels": ids}
        return masked_lm_batch(ids, d.vocab_size - 1)      # the last id stands for [MASK]

    return ModelBundle(
        name=job.model_label, module=module,
        kind="decoder" if d.kind == "decoder" else "encoder",
        make_inputs=make_inputs, loss=lambda out, inputs: out, tokens_per_sample=seq,
        lora_roles={"q": ("q_proj",), "k": ("k_proj",), "v": ("v_proj",), "o": ("o_proj",),
                    "mlp": ("gate_proj", "up_proj", "down_proj"), "lm_head": ("lm_head",),
                    "embed": ("embed_tokens",)})
