"""What older transformers releases ran where today's runs something else that keeps other
tensors: applied to a model built from today's release when the target stack is older
(`KernelSemantics.hf_loss_copies_logits`, trace/semantics.py).

* The causal-LM loss before 4.49 (transformers 4.46-4.48 `loss/loss_utils.py ForCausalLMLoss`;
  the models' own `forward` did the same before 4.46): the logits go to fp32, then the shift
  copies them, `shift_logits = logits[..., :-1, :].contiguous()`, a second fp32 (tokens - 1) x
  vocab tensor, alive with the first and with log-softmax's output at the end of the forward.
  4.49 pads the labels instead and views the fp32 logits (`nn.functional.pad(labels, (0, 1))`),
  what today's release traces. At 4,096 tokens and Mistral's 32,000-token vocabulary the copy is
  0.52 GB per sample.
"""
from __future__ import annotations


def causal_lm_loss_before_4_49(logits, labels, vocab_size: int, num_items_in_batch=None,
                               ignore_index: int = -100, **kwargs):
    """transformers 4.48.1's `ForCausalLMLoss`, line for line (module docstring)."""
    from transformers.loss.loss_utils import fixed_cross_entropy
    logits = logits.float()
    labels = labels.to(logits.device)
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    shift_logits = shift_logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(shift_logits.device)
    return fixed_cross_entropy(shift_logits, shift_labels, num_items_in_batch, ignore_index,
                               **kwargs)


def use_releases_before(model, hf_loss_copies_logits: bool) -> None:
    """Give a transformers causal LM the loss of a release before 4.49 where the target stack
    runs one."""
    if hf_loss_copies_logits and getattr(model, "loss_type", None) == "ForCausalLM":
        model.loss_function = causal_lm_loss_before_4_49
