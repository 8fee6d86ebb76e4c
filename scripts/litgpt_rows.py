"""LitGPT's resource-table rows traced with LitGPT's own model code, beside the measured peaks.

validate_memory.py predicts LitGPT's LoRA / QLoRA rows (tutorials/resource-tables.md, tables
made with litgpt 8641822, torch 2.1.0+cu121, bitsandbytes 0.41.1, A100-SXM4-40GB) with
transformers' Llama and trainplan's LoRA. This script traces the code those runs ran instead:
lit_gpt's `lora.GPT` (fused QKV linear whose LoRA output is scattered by `zero_pad`, LitGPT's
RMSNorm and RoPE, the head in 128-token chunks and the chunked cross entropy of
finetune/lora.py), as a `py:` model in pure bf16 with AdamW; with --quantize, every nn.Linear,
the head too, becomes a 4-bit linear that keeps its input for backward (Lightning's
BitsandbytesPrecision on bitsandbytes 0.41.1), and every `mean` keeps its input for backward, as
torch 2.1 did (KernelSemantics.mean_keeps_input). It prints each row's measured and predicted
peak allocated bytes and what the measured excess is per layer and sample, in bf16 elements of
the MLP's intermediate width (docs/validation.md, LitGPT).

    git clone https://github.com/Lightning-AI/litgpt && git -C litgpt checkout 8641822
    PYTHONPATH=src python scripts/litgpt_rows.py --litgpt litgpt

Needs only lit_gpt/{model,lora,config,rmsnorm}.py of that checkout (copied into a temporary
folder; lit_gpt/utils.py, which imports Lightning, is replaced by the two helpers they use).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

GB = 1e9
SEQ = 1304          # the longest Alpaca sample for Llama 2's tokenizer (the table's note)
# (model, quantize, micro-batch, measured max_memory_allocated in GB), resource-tables.md
ROWS = [("Llama-2-7b-hf", None, 1, 21.30), ("Llama-2-7b-hf", None, 2, 29.07),
        ("Llama-2-7b-hf", "nf4", 1, 14.14), ("Llama-2-7b-hf", "nf4-dq", 1, 13.84),
        ("Llama-2-13b-hf", None, 1, 38.12), ("Llama-2-13b-hf", "nf4", 1, 23.14),
        ("Llama-2-13b-hf", "nf4-dq", 1, 22.55)]
DIMS = {"Llama-2-7b-hf": (32, 11008), "Llama-2-13b-hf": (40, 13824)}   # layers, MLP width

UTILS = '''def find_multiple(n, k):
    return n if n % k == 0 else n + k - (n % k)


def map_old_state_dict_weights(state_dict, mapping, prefix):
    return state_dict
'''

FACTORY = '''import torch
from lit_gpt.lora import GPT, Config, mark_only_lora_as_trainable


def _loss(logits, targets):
    """finetune/lora.py: chunked_cross_entropy over the head's 128-token chunks."""
    chunks = [c.reshape(-1, c.size(-1)) for c in logits]
    targets = [t.reshape(-1) for t in targets.split(logits[0].size(1), dim=1)]
    return torch.cat([torch.nn.functional.cross_entropy(a, b, ignore_index=-1, reduction="none")
                      for a, b in zip(chunks, targets)]).mean()


class Step(torch.nn.Module):
    def __init__(self, name, seq):
        super().__init__()
        self.gpt = GPT(Config.from_name(name, r=8, alpha=16, dropout=0.05, to_query=True,
                                        to_value=True))
        mark_only_lora_as_trainable(self.gpt)
        self.gpt.max_seq_length = seq

    def forward(self, idx, targets):
        logits = self.gpt(idx, lm_head_chunk_size=128)
        logits[-1] = logits[-1][..., :-1, :]
        return _loss(logits, targets[..., 1:])


def build(name, seq, quant=None):
    step = Step(name, seq)
    if quant:       # Lightning's BitsandbytesPrecision converts every nn.Linear, the head too
        from trainplan import quantization
        from trainplan.models.lora import QuantLinear, _set
        q = quantization.parse(quant)
        for n, m in list(step.named_modules()):
            if isinstance(m, torch.nn.Linear):
                _set(step, n, QuantLinear(m, q, torch.bfloat16, keeps_input=True))
    return step
'''


def _setup(litgpt: Path, into: Path) -> None:
    pkg = into / "lit_gpt"
    pkg.mkdir()
    for name in ("model", "lora", "config", "rmsnorm"):
        text = (litgpt / "lit_gpt" / f"{name}.py").read_text()
        # flash-attn's import probe (lightning_utilities): absent here, as SDPA is what we trace
        text = text.replace("from lightning_utilities.core.imports import RequirementCache",
                            "RequirementCache = lambda *a, **k: False")
        (pkg / f"{name}.py").write_text(text)
    (pkg / "utils.py").write_text(UTILS)
    (pkg / "__init__.py").write_text("from lit_gpt.model import GPT\nfrom lit_gpt.config import "
                                     "Config\n")
    (into / "litgpt_step.py").write_text(FACTORY)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--litgpt", type=Path, required=True, help="a litgpt checkout at 8641822")
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(args.litgpt), "rev-parse", "--short=7", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    if rev and rev != "8641822":
        print(f"note: the checkout is at {rev}, the tables were made at 8641822", file=sys.stderr)
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.memory import estimate_memory, runtime
    from trainplan.predict.target import semantics_for
    from trainplan.spec import Job, validate
    from trainplan.trace.tracer import trace_step
    import dataclasses
    a100 = get_accelerator("a100-sxm4-40gb")
    with tempfile.TemporaryDirectory() as tmp:
        _setup(args.litgpt, Path(tmp))
        sys.path.insert(0, tmp)
        print(f"{'row':34} {'measured':>9} {'predicted':>9} {'error':>7} {'excess/layer/sample':>20}")
        for name, quant, batch, measured in ROWS:
            job = validate(Job(
                model=f"py:{tmp}/litgpt_step.py:build", batch_size=batch, precision="bf16",
                optimizer="adamw", model_args={"name": name, "seq": SEQ, "quant": quant},
                inputs=[{"name": n, "shape": ["batch", SEQ], "dtype": "int64", "high": 32000}
                        for n in ("idx", "targets")]))
            sem = dataclasses.replace(semantics_for(job, a100), bnb4_keeps_input=True,
                                      mean_keeps_input=True)   # torch 2.1.0
            mem = estimate_memory(trace_step(job, sem), a100, job, runtime("torch2"))
            got = mem.peak_allocated_bytes / GB
            layers, width = DIMS[name]
            excess = (measured - got) * GB / (layers * batch * SEQ * width * 2)
            label = f"{name} {quant or 'LoRA'} bs {batch}"
            print(f"{label:34} {measured:8.2f}G {got:8.2f}G {(got - measured) / measured:+7.1%} "
                  f"{excess:17.2f} x")


if __name__ == "__main__":
    main()
