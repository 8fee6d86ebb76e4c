"""Predicted vs measured per-device memory on published training runs; writes
validation/results/memory_validation.md.

Each published row becomes a job (the configuration its source states) and is compared with the
figure that matches what was measured (validation/PROVENANCE.md, "Memory rows"):

  hf        HF "Efficient Training on a Single GPU" (2022): bert-large-uncased sequence
            classification, seq 512, V100-SXM2-16GB, HF Trainer; NVML `used` after training
            -> device_used_bytes. The doc prints NVML `used // 1024**2` as "MB": the values are
            MiB. Runtime torch1.10 (January 2022, CUDA 11.2: zero_grad keeps gradients,
            per-parameter AdamW, eager kernel loading -- the doc's own 1343 MiB context says so --
            and softmax keeps its input for backward; so does mean before torch 2.2).
            transformers' BERT of 2022 had only its eager attention.
  litgpt    LitGPT resource tables (torch 2.1: mean keeps its input; bitsandbytes 0.41.1: the
            4-bit matmul keeps its input; A100-SXM4-40GB, bf16-true, LoRA r=8 alpha=16 on
            q and v, AdamW): torch.cuda.max_memory_allocated -> peak_allocated_bytes; OOM rows ->
            does not fit.
  torchtune Llama 3.2 3B full finetune, bs 2, packed seq 4096, bf16, AdamW, A100 (80 GB: 60 GiB
            was measured): "Peak Memory Active" -> peak_allocated_bytes.
  torchtitan Llama 3.1 8B, FSDP2 bf16 mixed precision, selective (op) AC, bs 2 seq 8192, on 8
            and 128 H100: max reserved over ranks -> peak_reserved_bytes (rows without
            torch.compile or Float8 only), with expandable segments, as torchtitan's launcher
            (run_llama_train.sh @9dec370) sets PYTORCH_CUDA_ALLOC_CONF.
  timm      RTX 3090 (24 GB) AMP train benchmark, torch 1.12 + CUDA 11.3 (runtime torch1.12),
            NCHW, SGD-momentum, eager attention (timm 0.6 composed attention itself; fused SDPA
            came in timm 0.9, 2023):
            the batch that ran fits; the next larger batch of timm's decay sequence (512, 384,
            256, 192, ...), which ran out of memory, does not. Every k-th model by sorted name
            (default k=8). The weaker reading "B fits, 2B does not" is scored too.

Traces are cached (pickled, without their op lists) in validation/.cache/memory_traces/, keyed by
the case and a hash of what a trace depends on (trace/, models/, spec.py, estimate.py, the
accelerator catalog); the memory model itself runs on every invocation, in seconds.

    PYTHONPATH=src python scripts/validate_memory.py [--timm-every K] [--refresh]
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import multiprocessing as mp
import pickle
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DATA = ROOT / "validation" / "data"
CACHE = ROOT / "validation" / ".cache" / "memory_traces"
OUT = ROOT / "validation" / "results" / "memory_validation.md"
TIMM_EVERY = 8
TRACE_TIMEOUT_S = 240
GB, GIB, MIB = 1e9, 2**30, 2**20
# PyTorch before 2.2 kept a mean's input for its backward (trace/semantics.py mean_keeps_input):
# the runs of HF's bert-large page (torch <= 1.10), PEFT's README (2023-02), LitGPT's tables
# (torch 2.1.0) and timm's pt112 benchmark (torch 1.12)
TORCH_BEFORE_2_2 = {"mean_keeps_input": True}
# Grouped-query K/V copied to every query head before attention (trace/semantics.py expands_kv):
# torchtune's MultiHeadAttention (`k.unsqueeze(2).expand(...).flatten(1, 2)`), torchtitan's
# Llama (`repeat_kv`) and transformers before 4.54 (`repeat_kv`). LitGPT's `expand` stays a
# view that the flash kernel reads in place, and its Llama 2 rows have no grouped heads anyway.
EXPANDS_KV = {"expands_kv": True}

# timm benchmark.py (pt112 files): on OOM, batch = timm.utils.decay_batch_step(batch)
TIMM_DECAY = (512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1)


@dataclass
class Case:
    """One published measurement as a job, and the figure it is compared with."""

    source: str
    label: str
    job: dict                 # Job keyword arguments
    accel: str
    runtime: str              # preset in data/overheads.json
    figure: str               # device_used_bytes | peak_allocated_bytes | peak_reserved_bytes | fits
    measured: float           # bytes, or 1.0 / 0.0 for fits / does not fit
    metric: str = ""          # what the source measured
    note: str = ""
    group: str = ""
    kernels: dict = field(default_factory=dict)   # KernelSemantics fields the run's stack sets

    def key(self) -> str:
        return json.dumps([self.job, self.accel, self.runtime, self.kernels], sort_keys=True)


@dataclass
class NotCovered:
    source: str
    what: str
    rows: int
    reason: str


@dataclass
class Result:
    case: Case
    predicted: float | None = None       # bytes, or 1.0 / 0.0
    error: str | None = None
    detail: dict = field(default_factory=dict)

    @property
    def rel_err(self) -> float | None:
        if self.predicted is None or self.case.figure == "fits":
            return None
        return (self.predicted - self.case.measured) / self.case.measured


# -- cases ---------------------------------------------------------------------------------------
def _rows(name: str) -> list[dict]:
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(f))


def hf_cases() -> tuple[list[Case], list[NotCovered]]:
    cases, skipped = [], []
    opt = {"AdamW (HF Trainer default)": "adamw", "Adafactor": "adafactor",
           "bnb Adam8bit": "adamw-8bit"}
    prec = {"fp32": "fp32", "amp_fp16": "fp16-amp"}
    peft, sd = [], 0
    for r in _rows("hf_single_gpu_memory.csv"):
        if r["source"].startswith("huggingface/peft"):
            if "stable-diffusion" in r["model"]:
                sd += 1
            else:
                peft.append(r)
            continue
        if r["metric"] != "gpu_memory_occupied_nvml" or not r["batch_size"]:
            continue          # context-only and weights-loaded baselines
        if r["notes"].startswith("duplicate of"):
            continue          # the same run re-printed in a newer page
        ga = int(re.search(r"gradient_accumulation_steps=(\d+)", r["notes"]).group(1))
        ck = "full" if "checkpointing" in r["technique"] else "none"
        if r["technique"].startswith("same as previous row"):
            ck = cases[-1].job["grad_checkpointing"]     # the previous row's configuration
        job = dict(model="hf:google-bert/bert-large-uncased", task="seq-classification",
                   batch_size=int(r["batch_size"]), grad_accum=ga, seq_len=int(r["seq_len"]),
                   precision=prec[r["precision"]], optimizer=opt[r["optimizer"]],
                   grad_checkpointing=ck, attention="eager")
        cases.append(Case("hf", f"{r['technique']} (bs {r['batch_size']}, ga {ga})", job,
                          "v100-sxm2-16gb", "torch1.10", "device_used_bytes",
                          float(r["value"]) * MIB, "NVML used", group="hf bert-large V100",
                          kernels=TORCH_BEFORE_2_2))
    cases += peft_cases(peft)
    skipped.append(NotCovered(
        "hf", "PEFT README gigabyte figures (T0_3B, mt0-xxl, bloomz-7b1; A100-80GB)",
        sum(r["metric"] == "gpu_memory" for r in peft),
        "compared as fit / no-fit only: the README states neither batch size, sequence length, "
        "precision, PyTorch release nor whether GB means 1e9 or 2^30 bytes"))
    skipped.append(NotCovered(
        "hf", "PEFT README Stable Diffusion v1-4 dreambooth", sd,
        "no diffusers model source in trainplan"))
    return cases, skipped


# PEFT README runs: the models' configs written by us from their published architectures
# (validation/data/configs/, see PROVENANCE.md); the example scripts' settings for
# ought/raft/twitter_complaints (batch 8, max_length 64, fp32, LoRA r=8 alpha=32 on q,v or
# query_key_value). Fit does not hinge on these: model states dominate every row.
PEFT_MODELS = {"bigscience/T0_3B": ("bigscience--T0_3B.json", "q,v"),
               "bigscience/mt0-xxl": ("bigscience--mt0-xxl.json", "q,v"),
               "bigscience/bloomz-7b1": ("bigscience--bloomz-7b1.json", "query_key_value")}


def peft_cases(rows: list[dict]) -> list[Case]:
    cases = []
    for r in rows:
        hub = r["model"].split(" ")[0]
        cfg, targets = PEFT_MODELS[hub]
        job = dict(model=f"hf:{DATA / 'configs' / cfg}", batch_size=8, seq_len=64,
                   precision="fp32", optimizer="adamw")
        t = r["technique"]
        if t.startswith("PEFT LoRA"):
            job["lora"] = {"rank": 8, "alpha": 32, "targets": targets}
        if "ZeRO-3" in t:
            job.update(strategy="zero3", offload="optimizer+params")
        fits = 0.0 if r["metric"] == "oom" else 1.0
        cases.append(Case("peft", f"{hub} {t}", job, "a100-sxm4-80gb", "torch2", "fits", fits,
                          metric="OOM" if fits == 0.0 else f"ran, {r['value']} GB",
                          group="peft fit", kernels=TORCH_BEFORE_2_2))
    return cases


LITGPT_MODELS = {"Llama 2 7B": "hf:meta-llama/Llama-2-7b-hf",
                 "Llama 2 13B": "hf:meta-llama/Llama-2-13b-hf"}


def llm_cases() -> tuple[list[Case], list[NotCovered]]:
    cases, skipped = [], []
    rows = _rows("llm_finetune_memory.csv")
    lit = [r for r in rows if "litgpt" in r["source"]]
    no_cfg = adapter = multi = 0
    for r in lit:
        if "Adapter" in r["technique"]:
            adapter += 1
            continue
        if int(r["num_gpus"]) > 1:
            multi += 1
            continue
        if r["model"] not in LITGPT_MODELS:
            no_cfg += 1
            continue
        q = "nf4-dq" if "nf4-dq" in r["precision"] else "nf4" if "nf4" in r["precision"] else "none"
        job = dict(model=LITGPT_MODELS[r["model"]], batch_size=int(r["batch_size"]),
                   seq_len=int(r["seq_len"]), precision="bf16", optimizer="adamw", quantize=q,
                   lora=dict(rank=8, alpha=16.0, targets="q,v", dropout=0.05))
        note = ("Lightning's BitsandbytesPrecision converts every nn.Linear, the output head too; "
                "trainplan keeps the head unquantised as transformers does") if q != "none" else ""
        # bitsandbytes 0.41.1 (the row's own note): its 4-bit matmul keeps each input
        kernels = {**TORCH_BEFORE_2_2, **({"bnb4_keeps_input": True}
                                          if "bitsandbytes 0.41" in r["notes"] else {})}
        label = f"{r['model']} LoRA {r['precision']} bs {r['batch_size']} s {r['seq_len']}"
        if r["metric"] == "oom":
            cases.append(Case("litgpt", label + " (OOM)", job, "a100-sxm4-40gb", "torch2",
                              "fits", 0.0, "OOM on 40 GB", note, group="litgpt fit",
                              kernels=kernels))
        else:
            cases.append(Case("litgpt", label, job, "a100-sxm4-40gb", "torch2",
                              "peak_allocated_bytes", float(r["value"]) * GB,
                              "max_memory_allocated (GB = 1e9 B)", note,
                              group="litgpt LoRA/QLoRA A100-40GB", kernels=kernels))
    skipped.append(NotCovered("litgpt", "phi-1.5, StableLM Alpha 3B, Falcon 40B rows", no_cfg,
                              "model config not bundled (hf:./config.json would need the hub "
                              "config, which is not in the repo)"))
    skipped.append(NotCovered("litgpt", "Adapter / Adapter-v2 rows", adapter,
                              "LLaMA-Adapter is not a model transform trainplan has"))
    skipped.append(NotCovered("litgpt", "multi-GPU LoRA rows (FSDP)", multi,
                              "their peak is above the single-GPU peak of the same model (7B "
                              "b1: 22.18 GB on 2 GPUs vs 21.30 GB on 1), so it is not the "
                              "sharded training step; what sets it is not in the source"))
    tt = [r for r in rows if "torchtune" in r["source"]]
    for r in tt:
        if r["technique"] == "cumulative: + Packed Dataset":
            job = dict(model="hf:meta-llama/Llama-3.2-3B", batch_size=2, seq_len=4096,
                       precision="bf16", optimizer="adamw")
            cases.append(Case("torchtune", "Llama 3.2 3B full bs 2 packed s 4096 (+ Packed "
                              "Dataset)", job, "a100-sxm4-80gb", "torch2",
                              "peak_allocated_bytes", float(r["value"]) * GIB,
                              "peak active bytes", "plain CrossEntropyLoss, no AC, no compile "
                              "(techniques before this row)", group="torchtune A100",
                              kernels=EXPANDS_KV))
    skipped.append(NotCovered(
        "torchtune", "other torchtune rows", len(tt) - 1,
        "baseline: unpacked Alpaca, sequence lengths unknown; later ablation rows use "
        "torch.compile, chunked CE, activation offloading or optimizer-in-backward, which "
        "trainplan does not trace; 8-GPU rows: recipe batch/sequence not stated"))
    tit = [r for r in rows if "torchtitan" in r["source"]]
    for r in tit:
        if r["metric"] == "peak_gpu_memory" and r["technique"] == "FSDP; selective AC" \
                and r["model"] == "llama3.1-8b":
            n = int(r["num_gpus"])
            job = dict(model="hf:meta-llama/Llama-3.1-8B", batch_size=int(r["batch_size"]),
                       seq_len=int(r["seq_len"]), precision="bf16-amp", optimizer="adamw",
                       grad_checkpointing="selective", strategy="fsdp", gpus=n,
                       # torchtitan's launcher (run_llama_train.sh at 9dec370) runs with
                       # PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"
                       expandable_segments=True)
            cases.append(Case("torchtitan", f"Llama 3.1 8B FSDP x{n} selective AC bs 2 s 8192",
                              job, "h100-sxm", "torch2", "peak_reserved_bytes",
                              float(r["value"]) * GIB, "max reserved over ranks",
                              "H100 96 GB HBM2e in the source; capacity does not enter "
                              "peak_reserved", group="torchtitan FSDP H100",
                              kernels=EXPANDS_KV))
    skipped.append(NotCovered("torchtitan", "compile / Float8 / TP / PP / CP rows",
                              len(tit) - sum(c.source == "torchtitan" for c in cases),
                              "torch.compile, Float8 linears and tensor/pipeline/context "
                              "parallelism are not traced"))
    return cases, skipped


# fms-acceleration's benchmark matrix (validation/data/published_memory_candidates.csv, rows
# marked complete; PROVENANCE.md): HF Trainer + TRL SFT, alpaca packed to 4096 tokens,
# flash-attn 2, gradient checkpointing (transformers 4.48: use_reentrant=True), adamw_torch,
# A100-80GB, rank 0's peak allocated, bitsandbytes 0.43.3 (its 4-bit matmul keeps no input).
# The plugin rows (fused kernels) are not modelled.
# Full and LoRA rows load the model in bf16 and train without autocast (pure bf16). The QLoRA rows
# run with `bf16=True` (autocast). On one GPU TRL 0.13's SFTTrainer prepares the 4-bit model with
# peft's prepare_model_for_kbit_training (every unquantised parameter to fp32) and then, as
# bf16=True, `peft_module_casting_to_bf16` (embeddings and head back to bf16, norms fp32;
# trl@v0.13.0 sft_trainer.py:191-233, trainer/utils.py:872): frozen_half "embeddings". The fp32
# norms make bitsandbytes return fp32, and so the residual stream and every checkpointed block
# input are fp32. Sharded (FSDP) QLoRA skips both and keeps the adapters in bf16
# (`is_sharded_qlora`, sft_trainer.py:182-224): frozen_half "all".
# transformers 4.48.1: its causal-LM loss copies the shifted fp32 logits (models/hf_releases.py)
TRANSFORMERS_4_48 = {"hf_loss_copies_logits": True, **EXPANDS_KV}
FMS_ROWS = {
    "fms-full-mistral7b-1g-bs4": dict(precision="bf16"),
    "fms-full-mistral7b-2g-bs2": dict(precision="bf16", strategy="fsdp", gpus=2),
    "fms-lora-mistral7b-1g-bs4": dict(precision="bf16", lora=True),
    "fms-lora-mistral7b-1g-bs8": dict(precision="bf16", lora=True),
    "fms-lora-mistral7b-2g-bs2": dict(precision="bf16", lora=True, strategy="fsdp", gpus=2),
    "fms-qlora-baseline-mistral7b-1g-bs4": dict(precision="bf16-amp", lora=True,
                                                quantize="nf4-dq", frozen_half="embeddings"),
    "fms-qlora-baseline-mistral7b-2g-bs2": dict(precision="bf16-amp", lora=True,
                                                quantize="nf4-dq", strategy="fsdp", gpus=2,
                                                frozen_half="all"),
}


def fms_cases() -> tuple[list[Case], list[NotCovered]]:
    rows = {r["id"]: r for r in _rows("published_memory_candidates.csv")}
    cases = []
    for rid, kw in FMS_ROWS.items():
        r = rows[rid]
        kw = dict(kw)
        job = dict(model="hf:mistralai/Mistral-7B-v0.1", batch_size=int(r["micro_batch"]),
                   seq_len=4096, optimizer="adamw", grad_checkpointing="full",
                   checkpoint_impl="reentrant", attention="flash", **kw)
        if job.pop("lora", False):
            job["lora"] = dict(rank=16, alpha=32.0, targets="q,k,v,o", dropout=0.05)
        tech = ("QLoRA nf4-dq" if "quantize" in kw else "LoRA r16" if "lora" in job else "full")
        where = f"FSDP x{kw['gpus']}" if "gpus" in kw else "1 GPU"
        cases.append(Case("fms", f"Mistral 7B {tech} bf16 {where} bs {r['micro_batch']} s 4096",
                          job, "a100-sxm4-80gb", "torch2", "peak_allocated_bytes",
                          float(r["value"]), "HF Trainer memory metrics (max_memory_allocated), "
                          "rank 0", "QLoRA: bf16 autocast; unquantised parameters as TRL 0.13 "
                          "leaves them (FMS_ROWS)" if "quantize" in kw else "",
                          group="fms A100-80GB", kernels=TRANSFORMERS_4_48))
    skipped = [NotCovered("fms", "accelerated-peft plugin rows, santacoder, Llama-2-70B", 4,
                          "fused kernels of the plugin are not traced; santacoder and Llama-2-70B "
                          "configs are not bundled")]
    return cases, skipped


H100_RECORDS = ROOT / "validation" / "measured" / "h100-sxm" / "records.jsonl"


def h100_cases() -> tuple[list[Case], list[NotCovered]]:
    """Our own `trainplan measure` runs on one H100 80GB HBM3 (torch 2.11, 2026-11; README "Measured
    on an H100"): each record's job as `measure` ran it, its peak allocated as measured."""
    cases = []
    for line in H100_RECORDS.read_text().splitlines():
        rec = json.loads(line)
        job = {k: v for k, v in rec["job"].items() if v is not None}
        if isinstance(job.get("lora"), dict):
            job["lora"] = {k: v for k, v in job["lora"].items() if v is not None}
        what = rec["command"].split("--model ", 1)[-1].split(" --out", 1)[0]
        cases.append(Case("h100", what, job, rec["accelerator"], "torch2",
                          "peak_allocated_bytes", float(rec["measured"]["peak_allocated_bytes"]),
                          "torch.cuda.max_memory_allocated (trainplan measure)",
                          group="trainplan measure H100 (ours)"))
    return cases, []


def next_larger(batch: int) -> int | None:
    i = TIMM_DECAY.index(batch) if batch in TIMM_DECAY else None
    return TIMM_DECAY[i - 1] if i else None


def timm_cases(every: int) -> tuple[list[Case], list[NotCovered]]:
    every_row = _rows("timm_train_rtx3090_amp_pt112.csv")
    rows = [r for r in every_row if r["layout"] == "nchw"]
    names = sorted({r["model"] for r in rows})
    keep = set(names[::every])
    cases = []
    for r in rows:
        if r["model"] not in keep:
            continue
        b, size = int(r["train_batch_size"]), int(r["train_img_size"])
        # timm of 2022 (0.6) composed attention itself (fused SDPA came in timm 0.9, 2023)
        base = dict(model=f"timm:{r['model']}", image_size=size, precision="fp16-amp",
                    optimizer="sgd-momentum", attention="eager")
        cases.append(Case("timm", f"{r['model']} @{size} bs {b} fits", {**base, "batch_size": b},
                          "rtx-3090", "torch1.12", "fits", 1.0, "ran", group="timm fit",
                          kernels=TORCH_BEFORE_2_2))
        up = next_larger(b)
        if up:
            cases.append(Case("timm", f"{r['model']} @{size} bs {up} OOM", {**base,
                              "batch_size": up}, "rtx-3090", "torch1.12", "fits", 0.0,
                              "next step of decay_batch_step ran out of memory",
                              group="timm fit", kernels=TORCH_BEFORE_2_2))
    sampled = sum(r["model"] in keep for r in rows)
    skipped = [NotCovered("timm", "other timm rows (nhwc, and nchw models not sampled)",
                          len(every_row) - sampled,
                          f"deterministic sample: every {every}th nchw model by sorted name")]
    return cases, skipped


# -- predictions ---------------------------------------------------------------------------------
# Capacity each run's driver reported (nvidia-smi total), used beside the catalog's usable memory
# for the fit checks: V100-SXM2-16GB 16160 MiB is in the HF source row itself; RTX 3090 24268 MiB
# and A100-SXM4-40GB 40536 MiB are what nvidia-smi prints with the drivers of 2021-2023 (460-525;
# newer drivers print 24576 / 40960 MiB).
DRIVER_CAPACITY_BYTES = {"v100-sxm2-16gb": 16160 * 2**20, "rtx-3090": 24268 * 2**20,
                         "a100-sxm4-40gb": 40536 * 2**20}
# what a trace depends on (not the memory model): a change elsewhere re-estimates without tracing
TRACE_INPUTS = ("trace", "models", "spec.py", "quantization.py", "estimate.py", "accelerators.py",
                "predict/target.py",
                "data/accelerators.csv")


def fingerprint(parts=TRACE_INPUTS) -> str:
    h = hashlib.sha256()
    pkg = ROOT / "src" / "trainplan"
    for p in sorted(pkg.rglob("*")):
        rel = p.relative_to(pkg).as_posix()
        if p.suffix in (".py", ".json", ".csv") and "__pycache__" not in p.parts \
                and any(rel == x or rel.startswith(x + "/") for x in parts):
            h.update(rel.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def make_job(kw: dict):
    from trainplan.spec import Job, Lora, validate
    kw = dict(kw)
    if "lora" in kw:
        kw["lora"] = Lora(**kw["lora"])
    return validate(Job(**kw))


def trace_case(case: Case):
    """The traced step of the case's job on its accelerator's kernels (ops dropped)."""
    import dataclasses
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.target import semantics_for
    from trainplan.trace.semantics import BEFORE_TORCH_2_9
    from trainplan.trace.tracer import trace_step
    job = make_job(case.job)
    # every published run predates PyTorch 2.9's fused RMSNorm; our H100 runs (torch 2.11) ran it
    kernels = case.kernels if case.source == "h100" else {**BEFORE_TORCH_2_9, **case.kernels}
    sem = dataclasses.replace(semantics_for(job, get_accelerator(case.accel)), **kernels)
    tr = trace_step(job, sem)
    from trainplan.predict.memory import SOFTMAX_OPS   # the only ops the memory model reads
    return dataclasses.replace(tr, ops=[r for r in tr.ops if r.name in SOFTMAX_OPS],
                               log=dataclasses.replace(tr.log, timeline=[]))


def estimate(case: Case, tr, capacity_bytes: int | None = None) -> dict:
    """The memory model on a traced step: three figures, fit and breakdown."""
    import dataclasses
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.memory import estimate_memory, runtime
    accel = get_accelerator(case.accel)
    if capacity_bytes:
        accel = dataclasses.replace(accel, usable_memory_bytes=capacity_bytes)
    m = estimate_memory(tr, accel, make_job(case.job), runtime(case.runtime))
    return {"peak_allocated_bytes": m.peak_allocated_bytes,
            "peak_reserved_bytes": m.peak_reserved_bytes,
            "device_used_bytes": m.device_used_bytes, "fits": float(m.fits),
            "fit_state": m.fit_state, "regime": m.band.regime,
            "device_class": m.band.device_class, "band": m.band.p95,
            "band_basis": m.band.basis, "fit_probability": m.fit_probability,
            "capacity_bytes": m.capacity_bytes, "peak_phase": m.peak_phase,
            "breakdown_bytes": m.breakdown_bytes, "attention": tr.semantics.attention}


def predict(case: Case) -> dict:
    """Trace and estimate one case in this process (what tests use)."""
    try:
        return estimate(case, trace_case(case))
    except Exception as e:  # noqa: BLE001 -- reported per row
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}


def _trace_path(case: Case, fp: str) -> Path:
    digest = hashlib.sha256((fp + case.key()).encode()).hexdigest()[:24]
    return CACHE / f"{digest}.pkl"


def _trace_to_cache(case: Case, path: str) -> str | None:
    try:
        tr = trace_case(case)
    except Exception as e:  # noqa: BLE001 -- reported per row
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    with open(path, "wb") as f:
        pickle.dump(tr, f)
    return None


_FP: list[str] = []      # the fingerprint run_all traced under (reestimate reads the same)


def run_all(cases: list[Case], refresh: bool) -> tuple[list[Result], int]:
    """Trace what is not cached (2 processes), then estimate every case here; also returns how
    many configurations were traced."""
    fp = fingerprint()
    _FP[:] = [fp]
    CACHE.mkdir(parents=True, exist_ok=True)
    errors_file = CACHE / f"errors-{fp}.json"
    errors = {} if refresh or not errors_file.exists() else json.loads(errors_file.read_text())
    todo = {}
    for c in cases:
        path = _trace_path(c, fp)
        if (refresh or not path.exists()) and (refresh or c.key() not in errors):
            todo[c.key()] = (c, path)
    if todo:
        print(f"tracing {len(todo)} configurations on 2 processes ...", flush=True)
        t0 = time.time()
        with mp.get_context("spawn").Pool(2, maxtasksperchild=10) as pool:
            pending = {k: pool.apply_async(_trace_to_cache, (c, str(p)))
                       for k, (c, p) in todo.items()}
            for i, (k, res) in enumerate(pending.items()):
                try:
                    err = res.get(timeout=TRACE_TIMEOUT_S)
                except mp.TimeoutError:
                    err = f"timed out after {TRACE_TIMEOUT_S} s"
                if err:
                    errors[k] = err
                if i % 20 == 19:
                    print(f"  {i + 1}/{len(todo)} ({time.time() - t0:.0f} s)", flush=True)
            pool.terminate()
        errors_file.write_text(json.dumps(errors))
        print(f"  done in {time.time() - t0:.0f} s", flush=True)
    (CACHE / "latest.json").write_text(json.dumps(    # for ad-hoc analysis of the last run
        {c.key(): str(_trace_path(c, fp)) for c in cases if c.key() not in errors}))
    out = []
    for c in cases:
        if c.key() in errors:
            out.append(Result(c, None, errors[c.key()]))
            continue
        with open(_trace_path(c, fp), "rb") as f:
            tr = pickle.load(f)
        d = estimate(c, tr)
        if c.figure == "fits" and c.accel in DRIVER_CAPACITY_BYTES:
            d["driver"] = estimate(c, tr, DRIVER_CAPACITY_BYTES[c.accel])
        out.append(Result(c, float(d[c.figure]), None, d))
    return out, len(todo)


ROWS = ROOT / "validation" / "results" / "memory_rows.json"


def write_rows(results: list[Result]) -> dict:
    """validation/results/memory_rows.json: every numeric row with its regime and device class,
    what scripts/fit_bands.py turns into the verdict bands."""
    import os
    import platform
    import torch
    rows = [{"source": r.case.source, "label": r.case.label, "group": r.case.group,
             "figure": r.case.figure, "accelerator": r.case.accel,
             "regime": r.detail["regime"], "device_class": r.detail["device_class"],
             "measured": r.case.measured, "predicted": r.predicted}
            for r in results if r.rel_err is not None]
    doc = {"as_of": time.strftime("%Y-%m-%d"), "script": "scripts/validate_memory.py",
           "machine": f"{os.cpu_count()}-core {platform.machine()} host, Python "
                      f"{platform.python_version()}, torch {torch.__version__}",
           "rows": rows}
    ROWS.parent.mkdir(parents=True, exist_ok=True)
    ROWS.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def reestimate(r: Result) -> Result:
    """The row estimated again from its cached trace (after the bands changed)."""
    if r.error:
        return r
    with open(_trace_path(r.case, _FP[0] if _FP else fingerprint()), "rb") as f:
        tr = pickle.load(f)
    d = estimate(r.case, tr)
    if r.case.figure == "fits" and r.case.accel in DRIVER_CAPACITY_BYTES:
        d["driver"] = estimate(r.case, tr, DRIVER_CAPACITY_BYTES[r.case.accel])
    return Result(r.case, float(d[r.case.figure]), None, d)


# -- scoring and report --------------------------------------------------------------------------
def abs_stats(errs: list[float]) -> tuple[int, float, float]:
    if not errs:
        return 0, float("nan"), float("nan")
    e = np.abs(np.asarray(errs)) * 100
    return len(e), float(np.median(e)), float(np.percentile(e, 90))


def fit_of(r: Result, view: str) -> float:
    """Predicted fit (1.0 / 0.0) with the catalog's capacity or the run's driver-reported one."""
    d = r.detail.get("driver", r.detail) if view == "driver" else r.detail
    return d["fits"]


def timm_rows_scored(results: list[Result], view: str = "catalog") -> tuple[int, int]:
    """Rows (model) right on both checks: fit at the batch that ran, no fit at the next step."""
    by_model: dict[str, list[Result]] = {}
    for r in results:
        if r.case.source == "timm" and r.predicted is not None:
            by_model.setdefault(r.case.label.split(" @")[0], []).append(r)
    ok = sum(all(fit_of(r, view) == r.case.measured for r in rs) for rs in by_model.values())
    return ok, len(by_model)


def fmt_bytes(x: float, unit: str) -> str:
    return f"{x / {'GB': GB, 'GiB': GIB, 'MiB': MIB}[unit]:.2f} {unit}"


def report(results: list[Result], skipped: list[NotCovered], every: int, seconds: float,
           traced: int) -> str:
    unit = {"hf": "MiB", "litgpt": "GB", "torchtune": "GiB", "torchtitan": "GiB", "fms": "GB",
            "h100": "GiB"}
    num = [r for r in results if r.rel_err is not None]
    fit = [r for r in results if r.case.figure == "fits" and r.predicted is not None]
    failed = [r for r in results if r.error]
    md = ["# Per-device memory: predicted vs measured", "",
          f"Generated by `PYTHONPATH=src python scripts/validate_memory.py` (timm: every "
          f"{every}th model) on {time.strftime('%Y-%m-%d')}, {seconds:.0f} s with "
          f"{traced} configurations traced in this run (cached traces otherwise; tracing all "
          "takes about 4-12 min on 2 cores). Data: "
          "`validation/data/` (see `validation/PROVENANCE.md`). Error = (predicted - measured) / "
          "measured of the figure the source measured.", "",
          "## Summary", "", "| group | figure | rows | median abs err | p90 abs err |",
          "|---|---|---|---|---|"]
    groups = sorted({r.case.group for r in num})
    for g in groups:
        sub = [r for r in num if r.case.group == g]
        n, med, p90 = abs_stats([r.rel_err for r in sub])
        md.append(f"| {g} | {sub[0].case.figure} | {n} | {med:.1f}% | {p90:.1f}% |")
    n, med, p90 = abs_stats([r.rel_err for r in num])
    md.append(f"| **all numeric rows** | | {n} | {med:.1f}% | {p90:.1f}% |")
    brief = [r for r in num if r.case.source != "torchtitan"]
    n, med, p90 = abs_stats([r.rel_err for r in brief])
    md.append(f"| numeric rows without torchtitan (the issue's sources) | | {n} | {med:.1f}% | "
              f"{p90:.1f}% |")
    for view, title in (("catalog", "capacity = catalog usable memory"),
                        ("driver", "capacity = what the run's driver reported")):
        md += ["", f"| fit / no-fit, {title} | right | of | accuracy |", "|---|---|---|---|"]
        for g in sorted({r.case.group for r in fit}):
            sub = [r for r in fit if r.case.group == g]
            ok = sum(fit_of(r, view) == r.case.measured for r in sub)
            md.append(f"| {g}: each check | {ok} | {len(sub)} | {100 * ok / len(sub):.1f}% |")
            for want, name in ((1.0, "fits (batch that ran)"), (0.0, "does not fit (OOM)")):
                s2 = [r for r in sub if r.case.measured == want]
                if s2:
                    ok2 = sum(fit_of(r, view) == want for r in s2)
                    md.append(f"| {g}: {name} | {ok2} | {len(s2)} | "
                              f"{100 * ok2 / len(s2):.1f}% |")
        ok, n_models = timm_rows_scored(results, view)
        if n_models:
            md.append(f"| **timm rows (both checks right)** | {ok} | {n_models} | "
                      f"{100 * ok / n_models:.1f}% |")
        ok2b, n2b = timm_2b(results, view)
        if n2b:
            md.append(f"| timm rows, weaker reading (B fits, 2B does not) | {ok2b} | {n2b} | "
                      f"{100 * ok2b / n2b:.1f}% |")
    md += ["", "Driver-reported capacity (nvidia-smi total): V100-SXM2-16GB 16160 MiB (the HF "
           "source's own nvidia-smi), RTX 3090 24268 MiB and A100-SXM4-40GB 40536 MiB (drivers "
           "460-525, 2021-2023; newer drivers print 24576 / 40960 MiB). The catalog holds 16, 24 "
           "and 40 GiB."]
    md += verdict_table(results)
    md += technique_table(num, fit)
    md += ["", "Targets (issue 16): median absolute error <= 5%, 90th percentile <= 12% on peak "
           "memory of sources the model never saw; fit/no-fit and largest batch right on >= 95%.",
           ""]
    md += ["## Rows compared", "",
           "| source | row | runtime | figure | measured | predicted | error | peak phase |",
           "|---|---|---|---|---|---|---|---|"]
    for r in [x for x in results if x.case.figure != "fits"]:
        u = unit[r.case.source]
        if r.predicted is None:
            md.append(f"| {r.case.source} | {r.case.label} | {r.case.runtime} | {r.case.figure} |"
                      f" {fmt_bytes(r.case.measured, u)} | failed: {r.error} | | |")
            continue
        md.append(f"| {r.case.source} | {r.case.label} | {r.case.runtime} | {r.case.figure} | "
                  f"{fmt_bytes(r.case.measured, u)} | {fmt_bytes(r.predicted, u)} | "
                  f"{r.rel_err * 100:+.1f}% | {r.detail.get('peak_phase', '')} |")
    md += ["", "Breakdown of the predicted peak (GB = 1e9 B; temporaries include fragmentation):",
           "", "| row | weights | gradients | optimizer states | activations | temporaries | "
           "context |", "|---|---|---|---|---|---|---|"]
    for r in [x for x in results if x.case.figure != "fits" and x.predicted is not None]:
        b = r.detail["breakdown_bytes"]
        md.append(f"| {r.case.label} | " + " | ".join(
            f"{b[k] / GB:.2f}" for k in ("weights", "gradients", "optimizer_states",
                                         "activations", "temporaries", "framework_overhead"))
                  + " |")
    md += ["", "## Fit / no-fit rows", "",
           "| source | check | measured | predicted (catalog) | device used / capacity "
           "| predicted (driver) | device used / capacity |", "|---|---|---|---|---|---|---|"]
    for r in [x for x in results if x.case.figure == "fits"]:
        if r.predicted is None:
            continue
        cells = []
        for view in ("catalog", "driver"):
            d = r.detail if view == "catalog" else r.detail.get("driver", r.detail)
            mark = "" if fit_of(r, view) == r.case.measured else " **wrong**"
            tight = " (tight)" if d.get("fit_state") == "tight" else ""
            cells.append(f"{'fits' + tight if fit_of(r, view) else 'OOM'}{mark} | "
                         f"{d['device_used_bytes'] / GIB:.2f} / {d['capacity_bytes'] / GIB:.2f} GiB")
        md.append(f"| {r.case.source} | {r.case.label} | {'fits' if r.case.measured else 'OOM'} "
                  f"| {' | '.join(cells)} |")
    md += ["", "## Not compared", "", "| source | rows | what | why |", "|---|---|---|---|"]
    for s in skipped:
        md.append(f"| {s.source} | {s.rows} | {s.what} | {s.reason} |")
    fm = sorted({(r.case.job['model'], r.error) for r in failed})
    if fm:
        md += ["", f"Failed to trace ({len(fm)} models, their rows are left out):", ""]
        md += [f"- `{m}`: {e}" for m, e in fm]
    return "\n".join(md) + "\n"


def technique(c: Case) -> str:
    """The regime a row belongs to, for the per-technique table."""
    j = c.job
    if j.get("strategy") in ("fsdp", "zero1", "zero2", "zero3") or j.get("gpus", 1) > 1:
        return "sharded (FSDP / ZeRO)"
    if j.get("quantize", "none") != "none":
        return "QLoRA (quantised base)"
    if j.get("lora"):
        return "LoRA"
    if c.source == "timm":
        return "CNN / ViT (timm)"
    return "full fine-tuning"


def technique_table(num: list[Result], fit: list[Result]) -> list[str]:
    """Error per technique, each row's source held out. No memory parameter is fitted to any of
    these rows (every constant comes from a library's source or documentation: data/
    overheads.json, data/sharding.json, quantization.py), so a source's error is already its
    leave-one-source-out error; the table says how many sources each technique rests on."""
    md = ["", "### Per technique (every source held out: nothing in the memory model is fitted "
          "to these rows)", "", "| technique | sources | rows | median abs err | p90 abs err | "
          "fit checks right | OOM rows called tight |", "|---|---|---|---|---|---|---|"]
    for t in sorted({technique(r.case) for r in num + fit}):
        sub = [r for r in num if technique(r.case) == t]
        fs = [r for r in fit if technique(r.case) == t]
        n, med, p90 = abs_stats([r.rel_err for r in sub])
        ok = sum(fit_of(r, "catalog") == r.case.measured for r in fs)
        oom = [r for r in fs if r.case.measured == 0.0]
        tight = sum(r.detail.get("fit_state") == "tight" for r in oom)
        srcs = ", ".join(sorted({r.case.source for r in sub + fs}))
        stats = f"{med:.1f}% | {p90:.1f}%" if n else "- | -"
        md.append(f"| {t} | {srcs} | {n} | {stats} | {ok} / {len(fs)} | {tight} / {len(oom)} |")
    return md


VERDICT_WORDS = {"fits": "FITS", "tight": "TIGHT", "does not fit": "WON'T FIT"}


def verdict_checks(results: list[Result]) -> list[tuple[str, str, bool, str]]:
    """(group, verdict, ran, label) for every published or measured run the verdict can be
    checked on: the fit / no-fit rows (timm read strictly, PEFT, LitGPT's OOM rows), and every
    numeric row, which ran on its device (torchtitan's ran on 96 GB H100s the catalog lacks)."""
    out = []
    for r in results:
        if r.predicted is None or r.case.source == "torchtitan":
            continue
        ran = r.case.measured == 1.0 if r.case.figure == "fits" else True
        group = r.case.group if r.case.figure == "fits" else "numeric rows (each ran)"
        out.append((group, VERDICT_WORDS[r.detail["fit_state"]], ran, r.case.label))
    return out


def verdict_table(results: list[Result]) -> list[str]:
    """How often each verdict was right: FITS on a run that ran, WON'T FIT on one that ran out
    of memory; TIGHT is right either way by design (the band straddles the capacity), so its
    runs are split. Capacity: the catalog's."""
    checks = verdict_checks(results)
    md = ["", "### Verdicts against the runs (catalog capacity, the band of data/fit_bands.json)",
          "", "| checks | verdict | runs | ran | ran out of memory | right |",
          "|---|---|---|---|---|---|"]
    for group in sorted({c[0] for c in checks}) + ["**all**"]:
        sub = [c for c in checks if group == "**all**" or c[0] == group]
        for word in ("FITS", "TIGHT", "WON'T FIT"):
            vs = [c for c in sub if c[1] == word]
            if not vs:
                continue
            ran = sum(c[2] for c in vs)
            right = (f"{100 * ran / len(vs):.1f}%" if word == "FITS" else
                     f"{100 * (len(vs) - ran) / len(vs):.1f}%" if word == "WON'T FIT" else "-")
            md.append(f"| {group} | {word} | {len(vs)} | {ran} | {len(vs) - ran} | {right} |")
    wrong = [c for c in checks if c[1] == "FITS" and not c[2]]
    md += ["", "FITS on a run that ran out of memory: " + (
        "; ".join(f"{c[3]} ({c[0]})" for c in wrong) if wrong else "none") + "."]
    return md


def timm_2b(results: list[Result], view: str = "catalog") -> tuple[int, int]:
    """The weaker reading of a timm row: B fits and 2B does not. 2B >= the next decay step, so a
    predicted OOM at the next step implies one at 2B; otherwise 2B is predicted from the line
    through the two traced batches (memory is affine in batch for a fixed shape)."""
    by_model: dict[str, dict[int, Result]] = {}
    for r in results:
        if r.case.source == "timm" and r.predicted is not None:
            by_model.setdefault(r.case.label.split(" @")[0], {})[r.case.job["batch_size"]] = r
    ok = n = 0
    for rs in by_model.values():
        fit_rows = [r for r in rs.values() if r.case.measured == 1.0]
        if not fit_rows:
            continue
        b = fit_rows[0].case.job["batch_size"]
        n += 1
        if b == 512:
            ok += fit_of(fit_rows[0], view) == 1.0
            continue
        up = next_larger(b)
        if up not in rs:
            n -= 1
            continue
        d0, d1 = ((r.detail.get("driver", r.detail) if view == "driver" else r.detail)
                  for r in (rs[b], rs[up]))
        u0, u1, cap = d0["device_used_bytes"], d1["device_used_bytes"], d0["capacity_bytes"]
        used_2b = u0 + (u1 - u0) / (up - b) * b
        ok += (fit_of(rs[b], view) == 1.0) and (fit_of(rs[up], view) == 0.0 or used_2b > cap)
    return ok, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timm-every", type=int, default=TIMM_EVERY)
    ap.add_argument("--refresh", action="store_true", help="ignore the prediction cache")
    args = ap.parse_args()
    t0 = time.time()
    cases, skipped = [], []
    for c, s in (hf_cases(), llm_cases(), fms_cases(), h100_cases(),
                 timm_cases(args.timm_every)):
        cases += c
        skipped += s
    results, traced = run_all(cases, args.refresh)
    rows_doc = write_rows(results)
    import fit_bands
    from trainplan.predict import bands
    fit_bands.write(fit_bands.compute(rows_doc))
    bands.reload()
    results = [reestimate(r) for r in results]     # every verdict with the new bands
    md = report(results, skipped, args.timm_every, time.time() - t0, traced)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(md)
    print(md[: md.index("## Fit / no-fit rows")])
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
