"""Fit the step-time model's efficiency parameters on every source; write data/efficiency.json.

Rows (validation/data/, see validation/PROVENANCE.md), one `source` per publisher:
  timm               RTX 3090, AMP fp16, SGD-momentum, NCHW + NHWC (torch 1.12), every 9th model.
  dle                NVIDIA DeepLearningExamples on V100 (1-8 GPUs, DDP): BERT-large, ResNet-50,
                     ResNeXt101, SE-ResNeXt101, EfficientNet-B0/B4.
  llm-foundry        MPT 125M-70B (FSDP, 8-512 GPUs; A100-40GB/80GB, H100).
  torchtitan         Llama-3-8B (64 A100-80GB), Llama 2 13B/70B and Llama 3 70B (docs/performance.md).
  fms-fsdp, fms-acceleration-a100, hf-docs, nemo-automodel-lora, peft-metamathqa-l40s:
                     published_throughput_extra.csv (the last two are weak: reported, not fitted).
  trainplan-measure  our `trainplan measure` runs on one H100 SXM (torch 2.11), the host-bound
                     batch-1 runs of the same machine among them.
  trainplan-measure-h200  five `trainplan measure` runs on one H200 (validation/measured/h200),
                     another machine and host: a source of its own.
The accuracy claim is not this fit's: scripts/validate_time.py refits with each source (and each
GPU) left out. Not fitted, measured: matmul ceilings per GPU, the STREAM bandwidth fraction,
FlashAttention-2's utilisation by GPU generation and by head dimension (sources in
docs/kernel_ceilings_research.md), PyTorch's dispatch cost by path (scripts/host_dispatch.py)
and the CPU time of a CUDA launch. Traces are cached (op tables with shapes and issue order) in
validation/.cache/traces-v2.json.

    PYTHONPATH=src python scripts/calibrate_time.py [--refresh]
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DATA = ROOT / "validation" / "data"
CACHE = ROOT / "validation" / ".cache" / "traces-v2.json"
EFF = ROOT / "src" / "trainplan" / "data" / "efficiency.json"
TIMM_EVERY = 9            # every 9th model name of the torch-1.12 files -> ~100 models
TRACE_TIMEOUT_S = 90
VIT_RE = re.compile(r"vit|deit|swin|beit|cait|xcit|levit|mixer|convit|pit_|twins|crossvit|coat|"
                    r"tnt|volo|gmlp|resmlp|jx_nest|nest_|sequencer|mvit|poolformer|convmixer|"
                    r"eva|edgenext|maxvit|coatnet|mobilevit|efficientformer|gcvit|davit")
from trainplan.predict.time_params import FITTED as PARAMS, TimeParams  # noqa: E402
from trainplan.trace.semantics import BEFORE_TORCH_2_9  # noqa: E402
# Measured STREAM triad / device copy fraction of the spec bandwidth, not fitted
# (docs/kernel_ceilings_research.md section 2: V100 0.90, A100-40GB 0.88, A100-80GB 0.86-0.91,
# H100 SXM copy 0.87, H100 PCIe 0.92, RTX 4090 0.91)
BW_EFF = 0.90
# Physical ranges: a kernel never beats its peak; S01's best-shape matmul ceilings are 80-87%.
BOUNDS = {"host_scale": (0.3, 30.0), "tile_s": (1e-8, 2e-5), "tile_h_half": (0.5, 512.0),
          "cuda_emax": (0.2, 1.0), "attn_emax": (0.1, 0.95),
          "conv_rel": (0.3, 1.0), "gconv_half": (0.1, 256.0), "norm_bw_eff": (0.1, 0.95),
          "kernel_s": (2e-7, 8e-6), "nchw_passes": (0.01, 8.0), "dwconv_emax": (0.005, 1.0),
          "conv_hopper": (0.3, 1.0), "gdirect_emax": (0.005, 1.0)}
START = {"host_scale": 3.0, "tile_s": 1e-6, "tile_h_half": 16.0, "cuda_emax": 0.8,
         "dwconv_emax": 0.2, "attn_emax": 0.5, "conv_rel": 0.8, "gconv_half": 4.0, "norm_bw_eff": 0.5,
         "kernel_s": 2e-6, "nchw_passes": 1.0, "conv_hopper": 0.8, "gdirect_emax": 0.2}
# Fused attention's ceiling (attn_emax) is fitted, mostly on llm-foundry's rows (its triton flash
# kernel) and our own measured runs (PyTorch's flash and memory-efficient SDPA). For reference,
# FlashAttention-2 reports 50-73% of the A100 peak (Dao 2023, arXiv:2307.08691).
# Measured matmul ceilings (fraction of the dense fp32-accumulate peak), not fitted; sources in
# docs/kernel_ceilings_research.md section 1. S01 = stas00/ml-engineering MAMF table (best shape,
# @744d01e); SQ = zzc0721/torch-performance-test-data @9d82827 (best square torch.mm, a lower
# bound). GeForce cards run above their spec clock, so their best torch.mm passes the catalog's
# spec peak: RTX 3090 1.07 and 1.08 of it (two machines), RTX 4090 1.00-1.05 (median of six,
# 1.02). T4 is left to the fit: its 70 W cap is already its sustained_clock_fraction.
MATMUL_CEILING = {"a100-sxm4-40gb": 0.869, "a100-sxm4-80gb": 0.869,      # S01
                  "a100-pcie-40gb": 0.811, "a100-pcie-80gb": 0.811,      # S01
                  "h100-sxm": 0.803, "h200": 0.803,                      # S01 ("H200 the same")
                  "h100-pcie": 0.66, "l40s": 0.74, "rtx-a6000": 0.79,    # SQ
                  "v100-sxm2-16gb": 0.76, "v100-sxm2-32gb": 0.76, "l4": 0.58,   # SQ
                  "rtx-4090": 1.02, "rtx-3090": 1.07}                    # SQ
# Measured FP32 matmul ceilings on CUDA cores (no TF32: torch.mm's default since 1.12), fraction
# of the catalog's FP32 peak, not fitted: zzc0721/torch-performance-test-data database.md
# @0785868 (best square torch.mm over n = 1024-10240, 30 timed runs, PyTorch 2.2-2.8), that
# GPU's rows: V100 from the V100S (13.55 of 16.35 TFLOPS at its 1597 MHz), A100 SXM4 from the
# A100 and A800 SXM4 80GB (19.18, 19.08 of 19.5), A100 PCIe from the "A100 40GB" row (18.11; its
# form is not named, and it sits below the SXM4 rows as a 250 W card would), H100 SXM 52.11 (the
# 403.74 row ran in TF32), H200 51.34, RTX 3090 24.79 (median of 3), RTX 4090 54.72 (median of
# the four 24 GB cards), L40S 46.88, RTX A6000 23.92, B200 66.24, RTX 5090 68.37 (median of 2),
# H20 31.95, RTX PRO 6000 Blackwell 77.13 (workstation and server). GeForce Ampere/Ada/Blackwell
# count two FP32 datapaths an SM in their peak that a matmul does not fill (0.65-0.70). T4 as in
# MATMUL_CEILING: its sustained clock is the catalog's. A fit used to take one CUDA-core fraction
# for matmuls and convolutions alike (0.86, from DLE's V100 rows alone; 1.0 without them).
FP32_CEILING = {"v100-sxm2-16gb": 0.829, "v100-sxm2-32gb": 0.829,
                "a100-sxm4-40gb": 0.981, "a100-sxm4-80gb": 0.981,
                "a100-pcie-40gb": 0.929, "a100-pcie-80gb": 0.929,
                "h100-sxm": 0.778, "h200": 0.766, "rtx-3090": 0.696, "rtx-4090": 0.663,
                "l40s": 0.512, "rtx-a6000": 0.618, "b200": 0.828, "rtx-5090": 0.652,
                "h20": 0.726, "rtx-pro-6000-blackwell": 0.617}
FP32_EMAX_UNMEASURED = float(np.median(list(FP32_CEILING.values())))
FP32_CEILING_SOURCE = ("measured, not fitted: zzc0721/torch-performance-test-data database.md "
                       "@0785868 (best square FP32 torch.mm, no TF32, a lower bound) over the "
                       "catalog's FP32 peak; the median measured (fp32_emax) elsewhere; "
                       "scripts/calibrate_time.py FP32_CEILING")
# Fused attention by GPU generation (compute capability): FlashAttention-2 reaches 50-73% of the
# A100 peak (Dao 2023, midpoint 0.615) and 35% of the H100's (Shah et al. 2024, FA3 paper)
# Hopper: FlashAttention-2's forward+backward fraction of the H100's peak over the A100's, hd128,
# non-causal, 2k-16k tokens (FA2 paper Figs 4 and 7, flash-attention@0251105a assets): 2k
# (320/989)/(187/312) = 0.540, 4k 0.525, 8k 0.526, 16k 0.525
ATTN_GENERATION = {"9.0": 0.53}
# A GPU without a measurement: the median of the measured ceilings above (not fitted)
TC_EMAX_UNMEASURED = float(np.median(list(MATMUL_CEILING.values())))
# PyTorch's dispatch cost per op by path, measured on a CPU (`python scripts/host_dispatch.py`):
# what the host/device queue's per-kind host costs are built from (predict/host.py)
HOST_DISPATCH = {"forward_op_s": 5.82e-6, "backward_op_s": 2.98e-6, "inference_op_s": 3.20e-6,
                 "view_s": 0.90e-6}
# torch.utils.checkpoint's own work per op a checkpointed block reruns (`python
# scripts/host_paths.py`: a transformers decoder checkpointed as the traces do, two runs): the
# checkpointed step's host time beyond its forward and backward kernels at the plain step's
# costs is 42.2-42.4 us a rerun kernel, of which the rerun op's own forward dispatch is one
# forward kernel, 10.7-10.8 us: 31.5 us of Python a rerun op on this CPU (taken as the reference
# host's speed: both server EPYC cores). Measured, and not in the bundled fit: with it the fit
# and its cross-validation are as docs/validation.md says ("A checkpointed block's rerun on the
# host"); TRAINPLAN_FIT_CHECKPOINT_COST=1 fits and cross-validates with it.
CHECKPOINT_S = 31.5e-6
if os.environ.get("TRAINPLAN_FIT_CHECKPOINT_COST") == "1":
    HOST_DISPATCH["checkpoint_s"] = CHECKPOINT_S
# The model's own Python per module entered (`python scripts/host_paths.py --modules`, 2026-12-05,
# this 2-core machine: fitted on BERT, GPT-2 and Llama's transformers code, checked on T5's and
# ViT's, +0.7% and -15.0% where kernels alone give +6.9% and -48.5%; a second run 1.73): 1.62
# forward ops, taken at host_dispatch.py's forward op. A view in the backward costs a backward op (host_dispatch.py
# measures `backward_op_s` per backward op, views counted; host_paths.py --modules: 2.95 us a
# kernel, 4.09 us a view there). Measured, and not in the bundled fit: with them the fit and its
# cross-validation are as docs/validation.md says ("The model's own code on the host");
# TRAINPLAN_FIT_MODULE_COST=1 / TRAINPLAN_FIT_BACKWARD_VIEWS=1 fit and cross-validate with them.
MODULE_KERNELS = 1.62
if os.environ.get("TRAINPLAN_FIT_MODULE_COST") == "1":
    HOST_DISPATCH["module_s"] = MODULE_KERNELS * HOST_DISPATCH["forward_op_s"]
if os.environ.get("TRAINPLAN_FIT_BACKWARD_VIEWS") == "1":
    HOST_DISPATCH["backward_view_s"] = HOST_DISPATCH["backward_op_s"]
HOST_DISPATCH_SOURCE = ("measured, not fitted: `PYTHONPATH=src python scripts/host_dispatch.py` "
                        "on 2026-11-27, this project's 2-core CPU machine (AMD EPYC, torch "
                        "2.13.0+cpu), two runs within 3% (ratios backward 0.51-0.52, inference "
                        "0.55-0.57, view 0.155-0.157 of a forward op)" + (
                            "; torch.utils.checkpoint's own work per op a checkpointed block "
                            "reruns, 31.5 us (`python scripts/host_paths.py` on 2026-12-04, the "
                            "same machine, two runs)" if "checkpoint_s" in HOST_DISPATCH
                            else "") + (
                            "; the model's own code, 1.62 forward ops a module entered (`python "
                            "scripts/host_paths.py --modules` on 2026-12-05, the same machine)"
                            if "module_s" in HOST_DISPATCH else "") + (
                            "; a backward view costs a backward op (host_dispatch.py's backward "
                            "op counts views)" if "backward_view_s" in HOST_DISPATCH else ""))
# CPU time of one CUDA kernel launch beyond PyTorch's dispatch: no published measurement with
# its host CPU named was found (XLA's cost model assumes 5 us "in the absence of easy ways to
# query them"; docs/kernel_ceilings_research.md), so none is added: the fitted host_scale
# carries the launch with the dispatch
CUDA_LAUNCH_S = 0.0
CUDA_LAUNCH_SOURCE = ("none added: no published launch cost with its host CPU named; the "
                      "fitted host_scale carries it (docs/kernel_ceilings_research.md)")
# Compute that overlaps a collective runs slower: NCCL's kernels hold SMs (24 of an H100's 132
# beside an all-gather, NVIDIA developer forum thread 337991) and HBM bandwidth. Lee et al. 2025
# (arXiv:2507.03114, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
# Deep Learning") measure an 18.9% mean slowdown of overlapped compute (40.0% at most) over GPT
# and Llama training steps on 4 A100s and 4 H100s. Measured, not fitted (predict/comm.py); a
# fitted fraction came to 0.65 and did not carry from DDP's rows to FSDP's (docs/validation.md).
OVERLAP_SLOWDOWN = 0.189
OVERLAP_SLOWDOWN_SOURCE = ("measured, not fitted: the mean slowdown of compute overlapping a "
                           "collective, 18.9% (Lee et al. 2025, arXiv:2507.03114, A100 and H100)")
# TensorIterator's dynamic-casting loop (trace/casting.py) against the vectorized one, timed by
# PyTorch's own developers on the copy that each PR moved from the first to the second: fp32 ->
# fp16 on a power-limited H100 PCIe, 0.553 -> 0.437 ms at 134M elements (0.79; 0.76-0.83 from 8M
# to 2.1G; pytorch/pytorch#137053, 2024-10-28) and bf16 -> fp32 on an A100, 362 -> 322 us at 67M
# (0.89; 0.85 at 8M; pytorch/pytorch#195542, 2026-09-01): 0.84, their mean. Measured, not fitted.
CAST_BW = 0.84
CAST_BW_SOURCE = ("measured, not fitted: a dynamic-casting elementwise loop's rate against the "
                  "vectorized loop's, 0.79 (H100 PCIe, fp32->fp16 copy, 134M elements, "
                  "pytorch/pytorch#137053) and 0.89 (A100, bf16->fp32 copy, 67M elements, "
                  "pytorch/pytorch#195542): their mean")
# FlashAttention-2's forward+backward throughput at head dimension 64 against 128, non-causal
# (FA2 paper Fig. 4, A100: 162/187 at 2k, 176/203 at 16k; Fig. 7, H100: 274/320, 296/338):
# 0.866 = [64 / (64 + h)] / [128 / (128 + h)] gives h = 24
ATTN_HEAD_DIM_HALF = 24.0
# ... and by sequence: S / (S + s) through 1k and 2k against 16k, hd128 non-causal (A100
# 173, 187 of 203: s = 178, 175; H100 294, 320 of 338: s = 153, 115): s = 155 tokens
ATTN_SEQ_HALF = 155.0
ATTN_HEAD_DIM_SOURCE = ("derived, not fitted: FlashAttention-2's forward+backward TFLOP/s "
                        "(Dao 2023, arXiv:2307.08691, Figs 4 and 7; the images in "
                        "Dao-AILab/flash-attention@0251105a assets/flash2_{a100,h100}_fwd_bwd_"
                        "benchmark.png): head dimension 64 runs at 0.866 of 128 (h = 24); a "
                        "work item walking S keys at S / (S + 155) of its long-sequence rate; "
                        "Hopper at 0.53 of Ampere's fraction of the peak")


def timm_rows() -> list[dict]:
    rows = [r for r in csv.DictReader(open(DATA / "timm_train_rtx3090_amp_pt112.csv"))]
    names = sorted({r["model"] for r in rows})
    keep = set(names[::TIMM_EVERY])
    out = []
    for r in rows:
        if r["model"] not in keep:
            continue
        vit = bool(VIT_RE.search(r["model"]))
        out.append(dict(source="timm", gpu="rtx-3090", model=f"timm:{r['model']}", n=1,
                        family="vision transformer/MLP" if vit else "convnet",
                        precision="fp16-amp", batch=int(r["train_batch_size"]),
                        image=int(r["train_img_size"]), seq=None, optimizer="sgd-momentum",
                        ckpt="none", accum=1, strategy="single", attention="math",
                        channels_last=r["layout"] == "nhwc", task=None, dims=None,
                        # torch 1.12 cu113 wheels: cuDNN 8.3.2 (KernelSemantics docstring)
                        cudnn_grouped_direct=r["layout"] == "nhwc",
                        measured=float(r["train_samples_per_sec"]), unit="samples/s",
                        **_timm_other_model(r["model"]),
                        label=f"{r['model']} {r['layout']} b{r['train_batch_size']}"))
    return out


# Models the table's timm (c865028c34fc, 2022) built with InplaceABN: timm/models/tresnet.py's
# `conv2d_iabn` and the `*_iabn` variants call the inplace_abn package's CUDA kernels (the model
# raises ImportError without it, so the benchmark ran them); today's timm builds TResNet with
# BatchNorm + LeakyReLU, which is what the tool traces. The package's kernels read a (N, C, H*W)
# view of the activations with threads along H*W (src/inplace_abn_kernels.cuh, copied from
# PyTorch 1.1's NCHW batch norm): on channels-last tensors every thread's load is C elements from
# its neighbour's, uncoalesced, which is why the table's NHWC TResNets run 3-4x slower than its
# NCHW ones. Not the model the tool traces, in either layout: reported, kept out of fits and
# statistics.
TIMM_OTHER_MODEL = re.compile(r"^tresnet|_iabn$")


def _timm_other_model(model: str) -> dict:
    if TIMM_OTHER_MODEL.search(model):
        return dict(split="other-model",
                    why="the table's timm built it with InplaceABN (the inplace_abn package's "
                        "kernels), today's timm with BatchNorm")
    return dict(split="fit")


# DLE's EfficientNet table for DGX-1 V100 32GB prints one GPU at 36 (FP32) and 89 (AMP) img/s for
# EfficientNet-B4 and 8 GPUs at 641 and 1565, "Strong Scaling" 17.6x: per GPU, eight GPUs would
# run 2.2x faster than one at the same per-GPU batch, and the 16 GB table's one GPU runs the model
# at 83 and 204 img/s. The one-GPU rows contradict their own table: reported, kept out.
DLE_INCONSISTENT = {("efficientnet-b4", "V100-SXM2-32GB (DGX-1)", "1")}


def _dle_inconsistent(r: dict) -> dict:
    if (r["model"], r["gpu"], r["num_gpus"]) in DLE_INCONSISTENT:
        return dict(split="inconsistent", why="the table's own strong scaling to 8 GPUs is 17.6x")
    return dict(split="fit")


def _dle_gpu(g: str) -> str:
    return "v100-sxm2-16gb" if "16GB" in g else "v100-sxm2-32gb"


def dle_rows() -> list[dict]:
    out = []
    for r in csv.DictReader(open(DATA / "nvidia_dle_bert_resnet50.csv")):
        if not r["batch_size"] or int(r["num_gpus"]) > 8 or "V100" not in r["gpu"]:
            continue
        if "DGX-2H" in r["gpu"]:
            continue
        n, prec = int(r["num_gpus"]), ("fp16-amp" if r["precision"] == "amp_fp16" else "fp32")
        common = dict(source="dle", gpu=_dle_gpu(r["gpu"]), n=n, precision=prec,
                      batch=int(r["batch_size"]), accum=1, strategy="ddp" if n > 1 else "single",
                      ckpt="none", measured=float(r["value"]), unit="samples/s", split="fit",
                      dims=None)
        if r["model"].startswith("bert-large"):
            squad = "SQuAD" in r["model"]
            # run_squad.py trains fp32 with its own BertAdam (optimization.py), a Python loop of
            # per-parameter kernels (LOOP_OPTIMIZERS); fp16 with apex's multi-tensor FusedAdam,
            # and pretraining with a multi-tensor LAMB
            loop = OPTIMIZER_LOOPS and squad and prec == "fp32"
            # pretraining accumulates to a global batch of 65536 / 32768 sequences: the
            # all-reduce is amortised over many micro-batches (assumed 64 here)
            out.append(dict(common, model="hf:google-bert/bert-large-uncased", image=None,
                            family="bert", seq=int(r["seq_len"]), optimizer="adamw",
                            attention="math", channels_last=False, accum=1 if squad else 64,
                            task="seq-classification" if squad else None,
                            optimizer_loop=loop,
                            label=f"BERT-L {'squad' if squad else 'pretrain'} s{r['seq_len']} "
                                  f"{prec} {r['gpu'][:14]} x{n} b{r['batch_size']}"))
        elif r["model"].startswith("resnet50"):
            out.append(dict(common, model="timm:resnet50", image=int(r["image_size"]), seq=None,
                            family="convnet", optimizer="sgd-momentum", attention="math",
                            task=None, channels_last=prec != "fp32",
                            label=f"ResNet-50 {prec} {r['gpu'][:14]} x{n} b{r['batch_size']}"))
    # Held out by model: the other DLE ConvNets on the same V100s. AMP runs use NHWC (DLE's
    # --memory-format nhwc); EfficientNet trains with RMSprop, traced as Adam (same two
    # per-parameter states, one foreach pass each).
    timm_name = {"resnext101-32x4d": "resnext101_32x4d",
                 "se-resnext101-32x4d": "legacy_seresnext101_32x4d",
                 "efficientnet-b0": "efficientnet_b0", "efficientnet-b4": "efficientnet_b4"}
    for r in csv.DictReader(open(DATA / "nvidia_dle_convnets_v100.csv")):
        n, prec = int(r["num_gpus"]), ("fp16-amp" if r["precision"] == "amp_fp16" else "fp32")
        out.append(dict(source="dle", gpu=_dle_gpu(r["gpu"]), n=n, precision=prec,
                        batch=int(r["batch_size"]), accum=1,
                        strategy="ddp" if n > 1 else "single", ckpt="none", dims=None,
                        model=f"timm:{timm_name[r['model']]}", image=int(r["image_size"]),
                        seq=None, family="convnet", task=None, attention="math",
                        optimizer="adam" if "RMSprop" in r["optimizer"] else "sgd-momentum",
                        channels_last=prec != "fp32", measured=float(r["value"]),
                        unit="samples/s", **_dle_inconsistent(r),
                        label=f"{r['model']} {prec} {r['gpu'][:14]} x{n} b{r['batch_size']}"))
    return out


# llm-foundry MPT benchmark models (scripts/train/yamls/pretrain/mpt-*.yaml; benchmarked with
# learned position embeddings, biases, LayerNorm, GELU MLP 4d, tied embeddings, vocab 50368,
# no dropout, triton flash attention, and ComposerMPTCausalLM's default loss, `loss_fn:
# fused_crossentropy`: FlashAttention's fused cross-entropy kernel on labels shifted by
# torch.roll, llmfoundry/models/mpt/modeling_mpt.py; models/fused_loss.py). (d_model, n_heads,
# n_layers); the parameter counts are checked against the README's NumParams column for every row
# (assert in mpt_rows).
MPT = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24),
       "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
       "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80)}
MPT_GPU = {"a100_80gb": "a100-sxm4-80gb", "a100_40gb": "a100-sxm4-40gb", "h100_80gb": "h100-sxm"}
# Llama-3-8B (torchtitan): 8,030,261,248 parameters, checked in titan_rows
LLAMA3_8B = dict(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                 intermediate_size=14336, vocab_size=128256, kind="decoder", norm="rmsnorm",
                 activation="swiglu", positional_encoding="rotary", tie_embeddings=False,
                 dropout=0.0, bias=False, max_position_embeddings=8192)


def mpt_dims(size: str, seq: int) -> dict:
    d, h, n = MPT[size]
    return dict(hidden_size=d, num_layers=n, num_heads=h, intermediate_size=4 * d,
                vocab_size=50368, kind="decoder", norm="layernorm", activation="gelu",
                positional_encoding="learned", max_position_embeddings=seq,
                tie_embeddings=True, dropout=0.0, bias=True, loss="fused")


def reference_params(dims: dict) -> int:
    """Closed-form parameter count of models/reference.py's transformer (see its docstring)."""
    h, n = dims["hidden_size"], dims["num_layers"]
    f, v = dims["intermediate_size"], dims["vocab_size"]
    kv = h * (dims.get("num_kv_heads") or dims["num_heads"]) // dims["num_heads"]
    b = dims["bias"]
    attn = 2 * h * h + 2 * h * kv + (2 * h + 2 * kv if b else 0)
    mlp = (3 if dims["activation"] == "swiglu" else 2) * h * f + ((f + h) if b else 0)
    norm = (2 if b and dims["norm"] == "layernorm" else 1) * h
    emb = v * h * (1 if dims["tie_embeddings"] else 2)
    pos = dims["max_position_embeddings"] * h if dims["positional_encoding"] == "learned" else 0
    return n * (attn + mlp + 2 * norm) + norm + emb + pos


def llm_rows() -> list[dict]:
    out = []
    for r in csv.DictReader(open(DATA / "llmfoundry_mpt_benchmarks_wide.csv")):
        seq, n = int(r["SeqLen (T)"]), int(r["# GPUs"])
        dims = mpt_dims(r["Model"], seq)
        if reference_params(dims) != int(r["NumParams"]):
            raise AssertionError(f"MPT-{r['Model']} s{seq}: {reference_params(dims)} params "
                                 f"!= README {r['NumParams']}")
        out.append(dict(source="llm-foundry", gpu=MPT_GPU[r["GPU"]], model=f"mpt-{r['Model']}",
                        family="mpt", n=n, precision="bf16-amp",
                        batch=int(r["MicroBatchSize"]), image=None, seq=seq, optimizer="adamw",
                        accum=int(r["GradAccum"]),
                        ckpt="full" if r["Activation Checkpointing"] == "True" else "none",
                        strategy="fsdp", attention="flash", channels_last=False, task=None,
                        internode_gbps=stated_gbps(r["section"]),
                        # Composer never enters no_sync under FSDP: each micro-batch's
                        # gradients are reduce-scattered (Strategy.reduces_each_micro_batch)
                        sync_each_batch=True, max_grad_norm=CLIPPED["llm-foundry"],
                        dims=tuple(sorted(dims.items())), measured=float(r["Throughput (T/s/GPU)"]),
                        unit="tokens/s/GPU", split="fit",
                        label=f"MPT-{r['Model']} s{seq} {r['GPU']} x{n} mb{r['MicroBatchSize']}"
                              f"x{r['GradAccum']}"))
    assert reference_params(LLAMA3_8B) == 8_030_261_248
    for r in csv.DictReader(open(DATA / "torchtitan_llama3_8b_throughput.csv")):
        tech = r["technique"]
        # eager bf16 FSDP runs only: compile, float8 and TP/CP are kernels/plans the tracer does
        # not model; "selective layer" is every 2nd block in full (torchtitan's
        # selective_ac_option default '2', its toml configs of April 2024), "selective AC" the
        # op-level policy
        if any(k in tech for k in ("compile", "Float8", "float8", "TP", "CP")):
            continue
        off = "H100-96GB" in r["gpu"]
        out.append(dict(source="torchtitan", gpu="a100-sxm4-80gb" if "A100" in r["gpu"] else "h100-sxm",
                        model="llama-3-8b", family="llama", n=int(r["num_gpus"]),
                        precision="bf16-amp", batch=int(r["batch_size"]), image=None,
                        seq=int(r["seq_len"]), optimizer="adamw", accum=1,
                        ckpt="every-2" if "selective layer" in tech else "selective",
                        strategy="fsdp", attention="flash", channels_last=False, task=None,
                        max_grad_norm=CLIPPED["torchtitan"],
                        dims=tuple(sorted(LLAMA3_8B.items())), measured=float(r["value"]),
                        unit="tokens/s/GPU",
                        # H100 96 GB HBM2e capped at 500 W (Grand Teton) is not the catalog's
                        # 700 W HBM3 H100 SXM: reported, kept out of the error statistics
                        split="off-catalog" if off else "fit",
                        label=f"Llama3-8B {r['gpu'][:12]} x{r['num_gpus']} {tech[:28]}"))
    return out


def h100_rows(name: str = "h100_trainplan_measure.jsonl",
              source: str = "trainplan-measure") -> list[dict]:
    """Our own runs: `trainplan measure` on one H100 SXM 80GB HBM3 (700 W), torch 2.11, cuDNN 9.19,
    10 timed steps after 3 warm-up; synthetic inputs. Each record keeps its command line, which is
    parsed again here by the CLI's own parser, so the traced job is exactly the measured one."""
    import shlex
    out = []
    for line in open(DATA / name if "/" not in name else ROOT / name):
        rec = json.loads(line)
        argv = shlex.split(rec["command"])[2:]    # drop "trainplan measure"
        argv = argv[:argv.index("--steps")]        # keep the job's flags, drop measure's own
        j = rec["job"]
        out.append(dict(source=source, gpu=rec["accelerator"], argv=tuple(argv), n=1,
                        model=j["model"] if j["model"] != "transformer" else j.get("name"),
                        family="measured", precision=j["precision"], batch=j["batch_size"],
                        accum=j["grad_accum"], strategy=j["strategy"], dims=None,
                        measured=rec["measured"]["samples_per_s"], unit="samples/s",
                        split="fit", label=" ".join(a for a in argv if a not in
                                                     ("--gpu", "--accelerator", "h100-sxm"))))
    return out


# Other published throughputs (validation/data/published_throughput_extra.{csv,md}): used by the
# leave-one-source-out cross-validation like every other source. Rows whose setup the tool cannot
# express are listed with the reason and kept out: torch.compile, every k-th block checkpointed
# with k not stated, NVLink on a catalog GPU without it, hub ids not bundled.
EXTRA_MODEL = {"mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
               "NousResearch/Llama-2-70b-hf": "meta-llama/Llama-2-70b-hf"}
# reported, kept out of fits and headline: PEFT's MetaMathQA batches are padded to a varying
# length (210 is the mean unpadded length); NeMo AutoModel runs its own fused (TE, triton) kernels
WEAK_EXTRA = ("peft-metamathqa", "nemo-automodel")
# splits reported beside the statistics, never fitted: hardware outside the catalog, weak rows
# (WEAK_EXTRA), a model the tool does not trace as the table ran it (TIMM_OTHER_MODEL), rows
# their own table contradicts (DLE_INCONSISTENT)
OUTSIDE = ("off-catalog", "weak", "other-model", "inconsistent")
EXTRA_OPT = (("8bit", "adamw-8bit"), ("adafactor", "adafactor"), ("adam", "adamw"))
# Published runs whose AdamW was a Python loop over the parameters, a few kernels each
# (KernelSemantics.optimizer_foreach False; the row's `optimizer_loop`), not torch's multi-tensor
# one: transformers' own AdamW (src/transformers/optimization.py `AdamW.step`: `for p in
# group["params"]`), the Trainer's default (`adamw_hf`) until huggingface/transformers#25109
# (July 2023) made it torch's; NVIDIA's BertAdam
# (DeepLearningExamples BERT optimization.py, what run_squad.py trains fp32 with). Measured
# effect, and not in the bundled fit (docs/validation.md, "Published per-parameter optimizer
# loops"): TRAINPLAN_FIT_OPTIMIZER_LOOPS=1 traces those rows so, fits and cross-validates with them.
LOOP_OPTIMIZERS = ("adamw_hf", "HF AdamW")
OPTIMIZER_LOOPS = os.environ.get("TRAINPLAN_FIT_OPTIMIZER_LOOPS") == "1"


# Published runs that clipped the gradients' global norm to 1.0 before every step (the row's
# `max_grad_norm`, traced as torch's clip_grad_norm_: trace/optimizers.py `clip_gradients`):
CLIPPED = {
    # mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (@2a59782): `algorithms:
    # gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}`, the YAMLs
    # scripts/train/benchmarking/submit_benchmarks.py loads and leaves that key of
    "llm-foundry": 1.0,
    # torchtitan's job config `training.max_norm` (default 1.0; its Llama tomls keep it)
    "torchtitan": 1.0,
    # foundation-model-stack/fms-fsdp config `grad_clip_thresh: float = 1.0`
    "fms-fsdp": 1.0,
    # the HF Trainer's `max_grad_norm` default, which neither source's runs change
    "fms-acceleration-a100": 1.0, "hf-docs": 1.0,
}


def extra_source(source_id: str) -> str:
    """One name per publisher's table family: torchtitan's docs are one source (the Llama-3-8B
    table too), HF's two performance docs one."""
    name = re.sub(r"(-\d{2,4})+$", "", source_id)
    return {"torchtitan-perf": "torchtitan", "hf-perf-train-gpu-one": "hf-docs",
            "hf-perf-train-gpu-many-dp-ddp": "hf-docs"}.get(name, name)


def _extra_skip(r: dict) -> str | None:
    from trainplan.models.hf_names import bundled_index
    ck, notes = r["activation_checkpointing"], r["notes"].lower()
    if "compile" in r["source_id"]:
        return "torch.compile (fused kernels) is not modelled"
    if r["strategy"] not in ("single", "ddp", "dp", "fsdp", "hsdp", "zero1", "zero2", "zero3"):
        return f"strategy {r['strategy']} is not modelled"
    if ck.startswith("selective") and not ck.startswith("selective-op") and \
            _every_k(ck) is None:
        return "every k-th block checkpointed, k not stated"
    if "nvlink" in notes and "without nvlink" not in notes and "no nvlink" not in notes:
        return "NVLink bridge on a GPU the catalog lists with PCIe only"
    hf = EXTRA_MODEL.get(r["hf_id"], r["hf_id"])
    if hf and hf.lower() not in bundled_index():
        return f"hf:{hf} is not bundled"
    return None


def _every_k(ck: str) -> int | None:
    """K of "every Kth block" checkpointing as a row states it ("every 2nd block"), else None."""
    m = re.search(r"every (\d+)(?:st|nd|rd|th) block", ck)
    return int(m.group(1)) if m else None


def _mode(ck: str) -> str:
    """A row's activation_checkpointing as the job's --grad-checkpointing."""
    k = _every_k(ck)
    if k:
        return f"every-{k}"
    word = ck.split()[0]
    return "selective" if word.startswith("selective") else word


def stated_gbps(text: str) -> float | None:
    """The network between nodes where a source states it ("128 GPUs with 400 Gbps inter-node",
    fms-fsdp's README; "1600 Gbps node-node interconnect", llm-foundry's table headings): Gbit/s
    a node (Job.internode_gbps); None where unstated (predict/comm.py's default)."""
    m = re.search(r"(\d+) Gbps (?:inter-node|node-node)", text)
    return float(m.group(1)) if m else None


def extra_rows(with_skipped: bool = False) -> list[dict]:
    out, skipped = [], []
    for r in csv.DictReader(open(DATA / "published_throughput_extra.csv")):
        why = _extra_skip(r)
        label = f"{r['model'][:34]} {r['gpu']} x{r['num_gpus']} mb{r['micro_batch']}"
        if why:
            skipped.append((r["source_id"], label, why))
            continue
        hf = EXTRA_MODEL.get(r["hf_id"], r["hf_id"])
        ck = _mode(r["activation_checkpointing"])
        kw = dict(model=f"hf:{hf}" if hf else "transformer",
                  batch_size=int(r["micro_batch"]), seq_len=int(r["seq_len"]),
                  precision=r["precision"], grad_checkpointing=ck,
                  optimizer=next((o for k, o in EXTRA_OPT if k in r["optimizer"].lower()),
                                 "adamw"))
        if r["lora_rank"]:
            targets = r["lora_targets"]
            kw["lora"] = (int(r["lora_rank"]), "all-linear" if "all" in targets else targets)
        if r["quantize"]:
            kw["quantize"] = r["quantize"]
        if "sequence-clas" in r["model"].lower():
            kw["task"] = "seq-classification"
        source = extra_source(r["source_id"])
        if source in CLIPPED:
            kw["max_grad_norm"] = CLIPPED[source]
        if r["dims_json"]:
            kw["dims"] = tuple(sorted(dict(json.loads(r["dims_json"]), kind="decoder",
                                           dropout=0.0,
                                           max_position_embeddings=int(r["seq_len"])).items()))
            kw["name"] = r["model"]
        n, unit = int(r["num_gpus"]), r["measured_unit"]
        value = float(r["measured_value"])
        if unit == "s/step":      # samples per step / seconds per step
            value, unit = int(r["micro_batch"]) * int(r["grad_accum"]) * n / value, "samples/s"
        elif unit.startswith("samples/s"):
            unit = "samples/s"
        out.append(dict(source=source, gpu=r["gpu"], n=n, jobkw=tuple(sorted(kw.items())),
                        optimizer_loop=OPTIMIZER_LOOPS and any(k in r["optimizer"]
                                                               for k in LOOP_OPTIMIZERS),
                        internode_gbps=stated_gbps(r["notes"]),
                        model=kw["model"], family="extra", precision=r["precision"],
                        batch=int(r["micro_batch"]), accum=int(r["grad_accum"]),
                        strategy=r["strategy"], dims=None, seq=int(r["seq_len"]),
                        measured=value, unit=unit,
                        split="weak" if r["source_id"].startswith(WEAK_EXTRA) else "fit",
                        label=f"{label} {r['precision']} ck={ck}"
                              + (f" lora{r['lora_rank']}" if r["lora_rank"] else "")
                              + (f" {r['quantize']}" if r["quantize"] else "")))
    return (out, skipped) if with_skipped else out


def host_rows() -> list[dict]:
    """Host-bound runs (batch 1, 16 tokens): `trainplan measure` on the same H100 machine as the
    other trainplan-measure rows, so the same source."""
    return h100_rows("h100_host_overhead.jsonl")


def all_rows() -> list[dict]:
    """Every measured row; `split` is "fit" (usable by a fit) or one of OUTSIDE."""
    return (timm_rows() + dle_rows() + llm_rows() + h100_rows()
            + h100_rows("validation/measured/h100-sxm/records.jsonl") + host_rows()
            + h100_rows("validation/measured/h200/records.jsonl", "trainplan-measure-h200")
            + extra_rows())


def trace_key(r: dict) -> str:
    if "_key" not in r:
        r["_key"] = _trace_key(r)
    return r["_key"]


def _row_key(r: dict) -> str:
    if "jobkw" in r:
        return "job|" + repr(r["jobkw"]) + "|" + r["gpu"]
    if "argv" in r:
        return "argv|" + "|".join(r["argv"]) + "|" + r["gpu"]
    return "|".join(str(r[k]) for k in ("model", "batch", "image", "seq", "precision", "optimizer",
                                        "ckpt", "attention", "channels_last", "task", "dims")) + \
        ("|cudnn-grouped-direct" if r.get("cudnn_grouped_direct") else "") + \
        (f"|clip{r['max_grad_norm']:g}" if r.get("max_grad_norm") else "")


def _trace_key(r: dict) -> str:
    return _row_key(r) + ("|loop" if r.get("optimizer_loop") else "")


def _argv_job(r: dict):
    """The measured job, from its recorded command line (run from the repository root)."""
    import os
    from trainplan.cli.common import job_from_args
    from trainplan.cli.main import build_parser
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        args = build_parser().parse_args(["measure", *r["argv"]])
        return job_from_args(args, args.job_file_pos)
    finally:
        os.chdir(here)


def make_job(r: dict, gpus: int = 1, strategy: str = "single", accum: int = 1):
    if "argv" in r:
        return _argv_job(r)
    if "jobkw" in r:
        from trainplan.models.reference import TransformerDims
        from trainplan.spec import Job, validate
        kw = dict(r["jobkw"])
        if "dims" in kw:
            kw["transformer"] = TransformerDims(**dict(kw.pop("dims")))
        if "lora" in kw:
            from trainplan.spec import Lora
            rank, targets = kw.pop("lora")
            kw["lora"] = Lora(rank=rank, alpha=2.0 * rank, targets=targets)
        return validate(Job(**kw, gpus=gpus, strategy=strategy, grad_accum=accum))
    from trainplan.models.reference import TransformerDims
    from trainplan.spec import Job, validate
    model = r["model"] if r["dims"] is None else "transformer"
    kw = dict(model=model, batch_size=r["batch"], precision=r["precision"],
              optimizer=r["optimizer"], grad_checkpointing=r["ckpt"], gpus=gpus,
              strategy=strategy, grad_accum=accum, channels_last=r["channels_last"],
              sync_each_batch=r.get("sync_each_batch", False),
              max_grad_norm=r.get("max_grad_norm"))
    if r["image"]:
        kw["image_size"] = r["image"]
    if r["seq"]:
        kw["seq_len"] = r["seq"]
    if r["task"]:
        kw["task"] = r["task"]
    if r["dims"] is not None:
        kw["transformer"] = TransformerDims(**dict(r["dims"]))
        kw["name"] = r["model"]
    return validate(Job(**kw))


# Every published run predates PyTorch 2.9's fused RMSNorm kernel: traced with the composite
# `F.rms_norm` they ran (trace/semantics.py BEFORE_TORCH_2_9). Our `measure` runs (torch 2.11)
# ran the fused one. Every published run with grouped-query heads copied its K/V to every query
# head before attention (trace/semantics.py expands_kv): torchtitan's Llama (`repeat_kv`), IBM's
# foundation-model-stack (`expand(...).flatten`), transformers before 4.54 (fms-acceleration's
# 4.48.1); our `measure` runs' transformers 5.17 passed them grouped to the flash kernel.
PUBLISHED_KERNELS = {**BEFORE_TORCH_2_9, "expands_kv": True}


def _trace_one(r: dict):
    import torch
    from trainplan.predict.optable import summarize
    from trainplan.trace.semantics import KernelSemantics
    from trainplan.trace.tracer import trace_step
    try:
        job = make_job(r)
        # what a published run's kernels did (our own `measure` runs: today's, as the tool sets)
        published = dict(PUBLISHED_KERNELS, optimizer_foreach=not r.get("optimizer_loop"))
        if "argv" in r or "jobkw" in r:
            from trainplan.accelerators import get_accelerator
            from trainplan.predict.target import semantics_for
            sem = semantics_for(job, get_accelerator(r["gpu"]))
            if "argv" not in r:
                sem = dataclasses.replace(sem, **published)
        else:
            dt = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}.get(r["precision"])
            sem = KernelSemantics(attention=r["attention"], autocast_dtype=dt,
                                  channels_last=r["channels_last"],
                                  cudnn_grouped_direct=bool(r.get("cudnn_grouped_direct")),
                                  **published)
        tr = trace_step(job, sem)
        table = summarize(tr)
        return trace_key(r), table.to_dict()
    except Exception as e:  # noqa: BLE001 -- reported as a skipped model
        return trace_key(r), {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def load_tables(rows: list[dict], refresh: bool = False) -> dict:
    """trace key -> OpTable dict (or {"error": ...}); traces missing keys on 2 processes."""
    cache = {} if refresh or not CACHE.exists() else json.loads(CACHE.read_text())
    todo = {trace_key(r): r for r in rows if trace_key(r) not in cache}
    if todo:
        print(f"tracing {len(todo)} configurations ...", flush=True)
        t0 = time.time()
        ctx = mp.get_context("spawn")
        with ctx.Pool(2, maxtasksperchild=20) as pool:
            pending = {k: pool.apply_async(_trace_one, (r,)) for k, r in todo.items()}
            for k, res in pending.items():
                try:
                    key, val = res.get(timeout=TRACE_TIMEOUT_S)
                except mp.TimeoutError:
                    key, val = k, {"error": f"trace timed out after {TRACE_TIMEOUT_S} s"}
                cache[key] = val
            pool.terminate()
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps(cache))
        print(f"  done in {time.time() - t0:.0f} s", flush=True)
    return cache


def predict(r: dict, tables: dict, params: TimeParams) -> float | None:
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.optable import OpTable
    from trainplan.predict.timing import estimate_step_time
    d = tables.get(trace_key(r))
    if d is None or "error" in d:
        return None
    if "_obj" not in d:
        d["_obj"] = OpTable.from_dict(d)
    job = _job_cache(r)
    st = estimate_step_time(d["_obj"], get_accelerator(r["gpu"]), job, calibration=params)
    return st.samples_per_s if r["unit"] == "samples/s" else st.tokens_per_s / st.n_devices


_JOBS: dict = {}


def _job_cache(r: dict):
    key = trace_key(r) + f"|{r['n']}|{r['strategy']}|{r['accum']}|{r.get('sync_each_batch')}" \
        f"|{r.get('internode_gbps')}"
    if key not in _JOBS:
        job = make_job(r, r["n"], r["strategy"], r["accum"])
        # the cluster's network where the source states it (not traced: timing only)
        _JOBS[key] = job.with_(internode_gbps=r.get("internode_gbps"))
    return _JOBS[key]


# How sources weigh in the objective: the same each (the bundled fit), or as the square root of
# their rows (TRAINPLAN_FIT_SOURCE_WEIGHT=sqrt, tried: docs/validation.md)
SOURCE_WEIGHT = os.environ.get("TRAINPLAN_FIT_SOURCE_WEIGHT", "equal")


def objective(x: np.ndarray, rows: list[dict], tables: dict) -> float:
    params = to_params(x)
    by_src: dict[str, list[float]] = {}
    for r in rows:
        p = predict(r, tables, params)
        if p:
            by_src.setdefault(r["source"], []).append(abs(np.log(p / r["measured"])))
    if SOURCE_WEIGHT == "sqrt":         # a source's weight grows as the root of its rows
        w = np.sqrt([len(v) for v in by_src.values()])
        return float(np.dot(w, [np.mean(v) for v in by_src.values()]) / w.sum())
    return float(np.mean([np.mean(v) for v in by_src.values()]))   # each source weighs the same


def to_params(x: np.ndarray) -> TimeParams:
    """The fitted values (the log-space vector `x`, each clipped to its BOUNDS) with the measured
    constants above, as the time model reads them."""
    out = {}
    for name, v in zip(PARAMS, x):
        lo, hi = BOUNDS[name]
        out[name] = float(np.exp(np.clip(v, np.log(lo), np.log(hi))))
    out.update(bw_eff=BW_EFF, tc_emax=TC_EMAX_UNMEASURED, attn_generation=ATTN_GENERATION,
               matmul_ceiling=MATMUL_CEILING, fp32_ceiling=FP32_CEILING,
               fp32_emax=FP32_EMAX_UNMEASURED, attn_head_dim_half=ATTN_HEAD_DIM_HALF,
               attn_seq_half=ATTN_SEQ_HALF,
               cuda_launch_s=CUDA_LAUNCH_S, host_dispatch=HOST_DISPATCH,
               overlap_slowdown=OVERLAP_SLOWDOWN, cast_bw=CAST_BW)
    return TimeParams.of(out)


def nelder_mead(f, x0: np.ndarray, iters: int = 1500, step: float = 0.5) -> np.ndarray:
    """Plain Nelder-Mead (no SciPy in the environment)."""
    pts = [x0] + [x0 + step * np.eye(len(x0))[i] for i in range(len(x0))]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1]); fr = f(xr)
        if fr < vals[0]:
            xe = c + 2 * (c - pts[-1]); fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c); fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
        if np.std(vals) < 1e-6:
            break
    return pts[int(np.argmin(vals))]


def fit_rows(rows: list[dict], tables: dict) -> list[dict]:
    """Rows a fit may use: traced, and not beside the statistics (OUTSIDE)."""
    return [r for r in rows if r["split"] not in OUTSIDE
            and "error" not in tables.get(trace_key(r), {"error": 1})]


CONVERGED = 1e-5          # a restart that improves the objective by less: the fit has converged
MAX_RESTARTS = 10


def fit(rows: list[dict], tables: dict, iters: int = 1500) -> tuple[TimeParams, float]:
    """Nelder-Mead on the rows from START, restarted from its optimum until a restart improves
    the objective by less than CONVERGED: (the parameters (to_params), the objective there).

    Restarted until converged, not a fixed number of times: a simplex stopped early leaves a
    fold's parameters where the optimiser happened to be, and the rows it holds out move with
    them (a fold without timm: 11.4% after one restart, 11.0% once converged, three or four
    restarts; docs/validation.md).

    A parameter no training row depends on (the CUDA-core convolutions' `cuda_emax` in a fold
    without DLE's fp32 V100 rows, the only rows that run them; `gdirect_emax` without timm's)
    keeps its START value instead of wandering wherever the simplex's steps leave it: the rows
    held out then get that prior, not noise (`identified`)."""
    x0 = np.log([START[k] for k in PARAMS])
    free = identified(rows, tables, x0)

    def full(z: np.ndarray) -> np.ndarray:
        x = x0.copy()
        x[free] = z
        return x

    f = lambda z: objective(full(z), rows, tables)
    z = nelder_mead(f, x0[free], iters=iters)
    best = f(z)
    for _ in range(MAX_RESTARTS):
        z_next = nelder_mead(f, z, iters=iters // 2, step=0.3)      # restart from the optimum
        value = f(z_next)
        gain = best - value
        if gain > 0:
            z, best = z_next, value
        if gain < CONVERGED:
            break
    return to_params(full(z)), best


def identified(rows: list[dict], tables: dict, x0: np.ndarray) -> np.ndarray:
    """Indices of the parameters some row's prediction depends on: halving one at x0 (doubling
    one at its lower bound) changes the objective."""
    base = objective(x0, rows, tables)
    out = []
    for i, k in enumerate(PARAMS):
        x = x0.copy()
        x[i] += np.log(2.0) if np.isclose(np.exp(x0[i]), BOUNDS[k][0]) else -np.log(2.0)
        if abs(objective(x, rows, tables) - base) > 1e-9:
            out.append(i)
    return np.array(out, dtype=np.int64)


def prepare(refresh: bool = False) -> tuple[list[dict], dict]:
    """All rows and their op tables (traced where missing)."""
    rows = all_rows()
    return rows, load_tables(rows, refresh=refresh)


def main() -> None:
    t0 = time.time()
    rows, tables = prepare(refresh="--refresh" in sys.argv)
    train = fit_rows(rows, tables)
    print(f"fitting {len(PARAMS)} parameters on {len(train)} rows of "
          f"{len({r['source'] for r in train})} sources")
    params, loss = fit(train, tables)
    n_src = {s: sum(r["source"] == s for r in train) for s in sorted({r["source"] for r in train})}
    EFF.write_text(json.dumps({"params": {k: getattr(params, k)
                                          for k in (*PARAMS, "bw_eff", "tc_emax",
                                                    "fp32_emax", "attn_head_dim_half",
                                                    "attn_seq_half", "cuda_launch_s",
                                                    "overlap_slowdown", "cast_bw")},
                               "matmul_ceiling": MATMUL_CEILING,
                               "fp32_ceiling": FP32_CEILING,
                               "attn_generation": ATTN_GENERATION,
                               "host_dispatch": HOST_DISPATCH, "provenance": {
        "command": "PYTHONPATH=src python scripts/calibrate_time.py",
        "date": datetime.date.today().isoformat(),
        "objective": "mean over sources of mean |log(predicted/measured throughput)|",
        "final_loss": round(loss, 5),
        "training_rows": n_src,
        "training_split": "every source's rows on catalog hardware (validation/PROVENANCE.md); "
                          "accuracy is reported on sources and GPUs the fit never saw: "
                          "scripts/validate_time.py refits with each source (and each GPU) left "
                          "out",
        "matmul_ceiling_source": "measured, not fitted: stas00/ml-engineering MAMF table "
                                 "(@744d01e, best shape) for A100/H100/H200; "
                                 "zzc0721/torch-performance-test-data (@9d82827, best square "
                                 "torch.mm, a lower bound) for V100, L4, L40S, RTX A6000, "
                                 "H100 PCIe, RTX 3090/4090 (above 1: their boost clocks); "
                                 "docs/kernel_ceilings_research.md",
        "fp32_ceiling_source": FP32_CEILING_SOURCE,
        "attn_generation_source": "measured ratio, not fitted: FlashAttention-2's forward+"
                                  "backward fraction of the peak on the H100 over the A100's, "
                                  "hd128 non-causal 2k-16k tokens, 0.525-0.540 (Dao 2023, "
                                  "arXiv:2307.08691, Figs 4 and 7)",
        "bw_eff_source": "measured, not fitted: STREAM triad / device copy fractions 0.86-0.92 "
                         "(docs/kernel_ceilings_research.md section 2)",
        "host_dispatch_source": HOST_DISPATCH_SOURCE,
        "cuda_launch_s_source": CUDA_LAUNCH_SOURCE,
        "overlap_slowdown_source": OVERLAP_SLOWDOWN_SOURCE,
        "cast_bw_source": CAST_BW_SOURCE,
        "attn_head_dim_half_source": ATTN_HEAD_DIM_SOURCE,
    }}, indent=1) + "\n")
    print(json.dumps(params.fitted(), indent=1))
    print(f"final loss {loss:.4f}; wrote {EFF.relative_to(ROOT)} in "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
