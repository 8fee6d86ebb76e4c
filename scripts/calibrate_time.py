"""Fit the step-time model's efficiency parameters on the TRAINING rows; write data/efficiency.json.

Rows (validation/data/, see validation/PROVENANCE.md):
  timm    RTX 3090, AMP fp16, SGD-momentum, nchw + nhwc (torch 1.12 files): a deterministic sample of
          models (every k-th name). Split by model: convnets whose name hashes to fold != 0 train;
          fold-0 convnets and every transformer/MLP-style model (vit, deit, swin, ...) are held out.
  dle     NVIDIA DeepLearningExamples on V100 (BERT-large pretraining seq 128/512 and SQuAD seq 384
          with per-GPU micro-batch; ResNet-50 v1.5), 1-8 GPUs, DDP: all TRAIN.
  llm     llm-foundry MPT-7B (A100 40/80 GB, FSDP) and torchtitan Llama-3-8B (A100, H100): all
          HELD OUT.
Traces are cached (op tables only) in validation/.cache/traces.json.

    PYTHONPATH=src python scripts/calibrate_time.py [--refresh]
"""
from __future__ import annotations

import csv
import datetime
import json
import multiprocessing as mp
import re
import sys
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DATA = ROOT / "validation" / "data"
CACHE = ROOT / "validation" / ".cache" / "traces.json"
EFF = ROOT / "src" / "trainplan" / "data" / "efficiency.json"
TIMM_EVERY = 9            # every 9th model name of the torch-1.12 files -> ~100 models
TRACE_TIMEOUT_S = 90
VIT_RE = re.compile(r"vit|deit|swin|beit|cait|xcit|levit|mixer|convit|pit_|twins|crossvit|coat|"
                    r"tnt|volo|gmlp|resmlp|jx_nest|nest_|sequencer|mvit|poolformer|convmixer|"
                    r"eva|edgenext|maxvit|coatnet|mobilevit|efficientformer|gcvit|davit")
GPU_MAP = {"a100_80gb": "a100-sxm4-80gb", "a100_40gb": "a100-sxm4-40gb", "h100_80gb": "h100-sxm"}
PARAMS = ("tc_emax", "tc_fhalf", "cuda_emax", "cuda_fhalf", "attn_emax", "attn_fhalf", "bw_eff",
          "launch_s", "nchw_conv_eff")
BOUNDS = {"tc_emax": (0.05, 1.0), "cuda_emax": (0.05, 1.0), "attn_emax": (0.05, 1.0),
          "bw_eff": (0.1, 1.0), "nchw_conv_eff": (0.2, 1.0), "tc_fhalf": (1e6, 1e12),
          "cuda_fhalf": (1e5, 1e12), "attn_fhalf": (1e6, 1e12), "launch_s": (1e-7, 1e-4)}


def timm_rows() -> list[dict]:
    rows = [r for r in csv.DictReader(open(DATA / "timm_train_rtx3090_amp_pt112.csv"))]
    names = sorted({r["model"] for r in rows})
    keep = set(names[::TIMM_EVERY])
    out = []
    for r in rows:
        if r["model"] not in keep:
            continue
        vit = bool(VIT_RE.search(r["model"]))
        fold = zlib.crc32(r["model"].encode()) % 3
        out.append(dict(source="timm", gpu="rtx-3090", model=f"timm:{r['model']}", n=1,
                        precision="fp16-amp", batch=int(r["train_batch_size"]),
                        image=int(r["train_img_size"]), seq=None, optimizer="sgd-momentum",
                        ckpt="none", accum=1, strategy="single", attention="math",
                        channels_last=r["layout"] == "nhwc", task=None,
                        measured=float(r["train_samples_per_sec"]), unit="samples/s",
                        split="test" if (vit or fold == 0) else "train",
                        label=f"{r['model']} {r['layout']} b{r['train_batch_size']}"))
    return out


def dle_rows() -> list[dict]:
    gpu = lambda g: "v100-sxm2-16gb" if "16GB" in g else "v100-sxm2-32gb"
    out = []
    for r in csv.DictReader(open(DATA / "nvidia_dle_bert_resnet50.csv")):
        if not r["batch_size"] or int(r["num_gpus"]) > 8 or "V100" not in r["gpu"]:
            continue
        if "DGX-2H" in r["gpu"]:
            continue
        n, prec = int(r["num_gpus"]), ("fp16-amp" if r["precision"] == "amp_fp16" else "fp32")
        common = dict(source="dle", gpu=gpu(r["gpu"]), n=n, precision=prec,
                      batch=int(r["batch_size"]), accum=1, strategy="ddp" if n > 1 else "single",
                      ckpt="none", measured=float(r["value"]), unit="samples/s", split="train")
        if r["model"].startswith("bert-large"):
            squad = "SQuAD" in r["model"]
            # pretraining accumulates to a global batch of 65536 / 32768 sequences: the
            # all-reduce is amortised over many micro-batches (assumed 64 here)
            out.append(dict(common, model="hf:google-bert/bert-large-uncased", image=None,
                            seq=int(r["seq_len"]), optimizer="adamw", attention="math",
                            channels_last=False, accum=1 if squad else 64,
                            task="seq-classification" if squad else None,
                            label=f"BERT-L {'squad' if squad else 'pretrain'} s{r['seq_len']} "
                                  f"{prec} {r['gpu'][:14]} x{n} b{r['batch_size']}"))
        elif r["model"].startswith("resnet50"):
            out.append(dict(common, model="timm:resnet50", image=int(r["image_size"]), seq=None,
                            optimizer="sgd-momentum", attention="math", task=None,
                            channels_last=prec != "fp32",
                            label=f"ResNet-50 {prec} {r['gpu'][:14]} x{n} b{r['batch_size']}"))
    return out


def llm_rows() -> list[dict]:
    out = []
    for r in csv.DictReader(open(DATA / "llmfoundry_mpt_benchmarks_wide.csv")):
        if r["Model"] != "7b" or r["GPU"] not in GPU_MAP:
            continue
        n = int(r["# GPUs"])
        out.append(dict(source="llm", gpu=GPU_MAP[r["GPU"]], model="hf:mosaicml/mpt-7b", n=n,
                        precision="bf16-amp", batch=int(r["MicroBatchSize"]), image=None,
                        seq=int(r["SeqLen (T)"]), optimizer="lion", accum=int(r["GradAccum"]),
                        ckpt="full" if r["Activation Checkpointing"] == "True" else "none",
                        strategy="fsdp", attention="flash", channels_last=False, task=None,
                        measured=float(r["Throughput (T/s/GPU)"]), unit="tokens/s/GPU",
                        split="test", label=f"MPT-7B s{r['SeqLen (T)']} {r['GPU']} x{n} "
                                            f"mb{r['MicroBatchSize']}"))
    for r in csv.DictReader(open(DATA / "torchtitan_llama3_8b_throughput.csv")):
        tech = r["technique"]
        if "compile" in tech or "Float8" in tech or "TP" in tech or "CP" in tech:
            continue
        g = "a100-sxm4-80gb" if "A100" in r["gpu"] else "h100-sxm"
        out.append(dict(source="llm", gpu=g, model="hf:meta-llama/Meta-Llama-3-8B",
                        n=int(r["num_gpus"]), precision="bf16-amp", batch=int(r["batch_size"]),
                        image=None, seq=int(r["seq_len"]), optimizer="adamw", accum=1,
                        ckpt="selective", strategy="fsdp", attention="flash",
                        channels_last=False, task=None, measured=float(r["value"]),
                        unit="tokens/s/GPU", split="test",
                        label=f"Llama3-8B {r['gpu'][:12]} x{r['num_gpus']} {tech[:28]}"))
    return out


def all_rows() -> list[dict]:
    return timm_rows() + dle_rows() + llm_rows()


def trace_key(r: dict) -> str:
    return "|".join(str(r[k]) for k in ("model", "batch", "image", "seq", "precision", "optimizer",
                                        "ckpt", "attention", "channels_last", "task"))


def make_job(r: dict, gpus: int = 1, strategy: str = "single", accum: int = 1):
    from trainplan.spec import Job, validate
    kw = dict(model=r["model"], batch_size=r["batch"], precision=r["precision"],
              optimizer=r["optimizer"], grad_checkpointing=r["ckpt"], gpus=gpus,
              strategy=strategy, grad_accum=accum, channels_last=r["channels_last"])
    if r["image"]:
        kw["image_size"] = r["image"]
    if r["seq"]:
        kw["seq_len"] = r["seq"]
    if r["task"]:
        kw["task"] = r["task"]
    return validate(Job(**kw))


def _trace_one(r: dict):
    import torch
    from trainplan.timing import summarize
    from trainplan.trace.semantics import KernelSemantics
    from trainplan.trace.tracer import trace_step
    try:
        dt = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}.get(r["precision"])
        sem = KernelSemantics(attention=r["attention"], autocast_dtype=dt,
                              channels_last=r["channels_last"])
        tr = trace_step(make_job(r), sem)
        table = summarize(tr)
        table.meta["channels_last"] = bool(r["channels_last"])
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


def predict(r: dict, tables: dict, params: dict) -> float | None:
    from trainplan.accelerators import get_accelerator
    from trainplan.timing import OpTable, estimate_step_time
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
    key = trace_key(r) + f"|{r['n']}|{r['strategy']}|{r['accum']}"
    if key not in _JOBS:
        _JOBS[key] = make_job(r, r["n"], r["strategy"], r["accum"])
    return _JOBS[key]


def objective(x: np.ndarray, rows: list[dict], tables: dict) -> float:
    params = to_params(x)
    by_src: dict[str, list[float]] = {}
    for r in rows:
        p = predict(r, tables, params)
        if p:
            by_src.setdefault(r["source"], []).append(abs(np.log(p / r["measured"])))
    return float(np.mean([np.mean(v) for v in by_src.values()]))   # each source weighs the same


def to_params(x: np.ndarray) -> dict:
    out = {}
    for name, v in zip(PARAMS, x):
        lo, hi = BOUNDS[name]
        out[name] = float(np.exp(np.clip(v, np.log(lo), np.log(hi))))
    return out


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


def main() -> None:
    t0 = time.time()
    rows = all_rows()
    tables = load_tables(rows, refresh="--refresh" in sys.argv)
    train = [r for r in rows if r["split"] == "train" and "error" not in tables[trace_key(r)]]
    start = json.loads(EFF.read_text())["params"]
    x0 = np.log([start.get(k, 1.0 if k == "nchw_conv_eff" else 0.5) for k in PARAMS])
    f = lambda x: objective(x, train, tables)
    print(f"fitting {len(PARAMS)} parameters on {len(train)} training rows; start loss {f(x0):.4f}")
    x = nelder_mead(f, x0)
    x = nelder_mead(f, x, iters=600, step=0.2)      # restart from the optimum
    params = to_params(x)
    n_src = {s: sum(r["source"] == s for r in train) for s in ("timm", "dle", "llm")}
    EFF.write_text(json.dumps({"params": params, "provenance": {
        "command": "PYTHONPATH=src python scripts/calibrate_time.py",
        "date": datetime.date.today().isoformat(),
        "objective": "mean over sources of mean |log(predicted/measured throughput)|",
        "final_loss": round(f(x), 5),
        "training_rows": n_src,
        "training_split": "timm convnets with crc32(name) % 3 != 0 (RTX 3090, torch 1.12 files, "
                          f"every {TIMM_EVERY}th model) + all DLE V100 BERT-large/ResNet-50 rows",
        "held_out": "timm fold-0 convnets and all transformer/MLP models; all LLM rows "
                    "(MPT-7B llm-foundry, Llama-3-8B torchtitan); see validation/PROVENANCE.md",
    }}, indent=1) + "\n")
    print(json.dumps(params, indent=1))
    print(f"final loss {f(x):.4f}; wrote {EFF.relative_to(ROOT)} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
