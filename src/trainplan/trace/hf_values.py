"""What transformers decides from its inputs' values, answered as the GPU run answers it.

A step is traced on fake tensors (FakeTensorMode): shapes and dtypes, no values. Where
transformers reads a value to choose a path, it first asks `is_tracing(tensor)`, which is true of
a fake tensor as of a torch.compile or torch.export graph, and on a tensor it cannot read it
takes the path that is right for any value. That path is not the one a GPU run takes, and here
it changes the attention kernel:

* `masking_utils.find_packed_sequence_indices` (transformers 4.54+). With no KV cache and no
  attention mask, which is training with `use_cache` off (gradient checkpointing turns it off,
  models/hf.py, as transformers, TRL and the Trainer do), the position ids are checked for packed
  sequences: a position that does not follow the one before it starts a new sequence. On the GPU
  the check reads the values, finds one sequence per row and returns None; the causal mask is
  then skipped (`_ignore_causal_mask_sdpa`) and SDPA runs with `is_causal`, where flash applies.
  On fake tensors transformers keeps the packed-sequence mask, builds a (batch, 1, s, s) boolean
  mask and passes it to every SDPA call, which then cannot take flash: a checkpointed
  Llama-3.2-1B step was traced with the memory-efficient kernel and a mask instead of flash.
  The tracer's inputs are never packed (each row one sequence, positions 0..s-1: models/hf.py
  `make_inputs`; Qwen-VL's text positions from its own `get_rope_index`), so the GPU's answer is
  None. The ops the GPU runs to find it (the diff, the cumsum, the comparison and the `all`) are
  traced as it runs them.

Nothing is changed where transformers is not imported, or has no such function.
"""
from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def as_on_gpu():
    """Within: transformers' value checks answered as on the GPU (module docstring)."""
    masking = sys.modules.get("transformers.masking_utils")
    find = getattr(masking, "find_packed_sequence_indices", None)
    if find is None:
        yield
        return

    def one_sequence_per_row(position_ids, *args, **kwargs):
        mask = find(position_ids, *args, **kwargs)
        if mask is not None:           # fake: the check the GPU makes on its values
            (mask[:, -1] == 0).all()
        return None

    masking.find_packed_sequence_indices = one_sequence_per_row
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = find
