"""Run `trainplan measure` over a matrix of jobs on this machine's GPU, then summarise.

Matrix (5 models x 2 micro-batches x 2 precisions x 2 checkpointing = 40 runs):

    bert-large           hf:google-bert/bert-large-uncased (masked LM), seq 512     b 8, 16
    gpt2                 hf:openai-community/gpt2 (causal LM), seq 1024              b 8, 16
    llama-3.2-1b-lora    hf:meta-llama/Llama-3.2-1B, LoRA r16 all-linear, seq 1024  b 4, 8
    resnet50             torchvision:resnet50, 224 px                                b 64, 128
    vit-b16              timm:vit_base_patch16_224, 224 px                           b 64, 128

    precision: full (tf32 on sm80+, where PyTorch users turn it on; fp32 below) and bf16-amp
               (fp16-amp on GPUs without bf16)
    checkpointing: none, full
    allocator: PyTorch's default caching allocator; `--allocator expandable` (or `both`) runs
               the jobs with expandable segments too (`measure --expandable-segments`), the
               check trace/derive/expandable.py awaits on a GPU (peak reserved beside peak
               allocated)

Every run is its own process (`python -m trainplan.cli.main measure ...`), so one run's cached
memory and allocator state cannot leak into the next run's peaks. Records go to --out (JSON lines,
the `trainplan measure` schema); runs that fail (out of memory, or anything else) go to
<out>.failures.jsonl with the command, the error and trainplan's predicted fit for the job.
`--summary` writes a Markdown table of predicted against measured from the records, and nothing
else: this script never makes up a number.

    python scripts/measure_matrix.py --dry-run                 # list the 40 commands
    python scripts/measure_matrix.py                           # run them (about 10-20 min on an H100)
    python scripts/measure_matrix.py --only gpt2 --steps 20
    python scripts/measure_matrix.py --only "llama-3.2-1b-lora b8" --allocator both
    python scripts/measure_matrix.py --summary                 # table from the records
    python scripts/measure_matrix.py --matrix profile --steps 5 --warmup 2   # PROFILE_MATRIX,
                                                # each run profiled (measure --profile)
    trainplan calibrate --records validation/measured/<accelerator>/records.jsonl
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MODELS = {
    "bert-large": (["--model", "hf:google-bert/bert-large-uncased", "--seq-len", "512"], (8, 16)),
    "gpt2": (["--model", "hf:openai-community/gpt2", "--seq-len", "1024"], (8, 16)),
    "llama-3.2-1b-lora": (["--model", "hf:meta-llama/Llama-3.2-1B", "--seq-len", "1024",
                           "--lora-rank", "16", "--lora-alpha", "32",
                           "--lora-targets", "all-linear"], (4, 8)),
    "resnet50": (["--model", "torchvision:resnet50", "--image-size", "224"], (64, 128)),
    "vit-b16": (["--model", "timm:vit_base_patch16_224", "--image-size", "224"], (64, 128)),
}
CHECKPOINTING = ("none", "full")
# `--matrix profile`: the jobs whose step time the model gets most wrong on our H100 and H200
# (validation/results/time_validation.md), each with `measure --profile`, so that one short
# GPU session says whether the kernels or the host are mispredicted: NCHW ResNet-50 in bf16
# with and without checkpointing, in TF32 (predicted too slow: how many of cuDNN's NCHW<->NHWC
# transposes a TF32 convolution pays, `nchw_passes`), and channels-last beside them; GPT-2 (+22
# to +35%), BERT-large and ViT-B checkpointed, Qwen2.5-0.5B (predicted too slow) and GLF-CR
# (host-bound). Ten runs, each its own process (not yet timed on a GPU: --timeout caps each).
PROFILE_MATRIX = {
    "resnet50 b64 bf16-amp": ["--model", "torchvision:resnet50", "--image-size", "224",
                              "--batch-size", "64", "--precision", "bf16-amp"],
    "resnet50 b64 bf16-amp ckpt=full": ["--model", "torchvision:resnet50", "--image-size", "224",
                                        "--batch-size", "64", "--precision", "bf16-amp",
                                        "--grad-checkpointing", "full"],
    "resnet50 b64 tf32": ["--model", "torchvision:resnet50", "--image-size", "224",
                          "--batch-size", "64", "--precision", "tf32"],
    "resnet50 b64 bf16-amp channels-last": ["--model", "torchvision:resnet50", "--image-size",
                                            "224", "--batch-size", "64", "--precision",
                                            "bf16-amp", "--channels-last"],
    "gpt2 b8 bf16-amp": ["--model", "hf:openai-community/gpt2", "--seq-len", "1024",
                         "--batch-size", "8", "--precision", "bf16-amp"],
    "gpt2 b8 bf16-amp ckpt=full": ["--model", "hf:openai-community/gpt2", "--seq-len", "1024",
                                   "--batch-size", "8", "--precision", "bf16-amp",
                                   "--grad-checkpointing", "full"],
    "bert-large b8 bf16-amp ckpt=full": ["--model", "hf:google-bert/bert-large-uncased",
                                         "--seq-len", "512", "--batch-size", "8", "--precision",
                                         "bf16-amp", "--grad-checkpointing", "full"],
    "vit-b16 b64 bf16-amp ckpt=full": ["--model", "timm:vit_base_patch16_224", "--image-size",
                                       "224", "--batch-size", "64", "--precision", "bf16-amp",
                                       "--grad-checkpointing", "full"],
    "qwen2.5-0.5b b8 bf16-amp": ["--model", "hf:Qwen/Qwen2.5-0.5B", "--seq-len", "1024",
                                 "--batch-size", "8", "--precision", "bf16-amp"],
    "glf-cr single": ["examples/glf-cr-2xt4.yaml", "--gpus", "1", "--strategy", "single"],
}


def precisions(full: str) -> tuple[str, str]:
    """(full precision, half precision AMP) for this machine's GPU."""
    import torch
    cc = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
    if full == "auto":
        full = "tf32" if cc >= (8, 0) else "fp32"
    half = "bf16-amp" if cc >= (8, 0) else "fp16-amp"
    return full, half


ALLOCATORS = {"default": ("",), "expandable": (" expandable",), "both": ("", " expandable")}


def matrix(full: str, only: list[str], allocator: str = "default",
           which: str = "main") -> list[tuple[str, list[str]]]:
    if which == "profile":
        return [(label, [*flags, "--optimizer", "adamw"] if "--model" in flags else flags)
                for label, flags in PROFILE_MATRIX.items()
                if not only or any(o in label for o in only)]
    runs = []
    for (name, (flags, batches)), prec, ckpt, alloc in itertools.product(
            MODELS.items(), precisions(full), CHECKPOINTING, ALLOCATORS[allocator]):
        for b in batches:
            label = f"{name} b{b} {prec} ckpt={ckpt}{alloc}"
            if only and not any(o in label for o in only):
                continue
            runs.append((label, [*flags, "--batch-size", str(b), "--precision", prec,
                                 "--grad-checkpointing", ckpt, "--optimizer", "adamw",
                                 *(["--expandable-segments"] if alloc else [])]))
    return runs


def default_out() -> Path:
    from trainplan.measure.device import describe_device, resolve_accelerator, resolve_device
    info = describe_device(resolve_device())
    acc, _ = resolve_accelerator(info, None)
    tag = acc or ("cpu" if info.type == "cpu" else re.sub(r"[^a-z0-9]+", "-", info.name.lower()))
    return ROOT / "validation" / "measured" / tag / "records.jsonl"


def _env() -> dict:
    """The runs' environment: this checkout's `src` first on PYTHONPATH, so that a GPU machine
    whose Python has torch and transformers but not trainplan installed runs this code."""
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH"))
                                        if p)
    return env


def predicted_fit(flags: list[str], accelerator: str | None) -> dict | None:
    """trainplan's own verdict for a failed run (did it predict the OOM?)."""
    if not accelerator:
        return None
    cmd = [sys.executable, "-m", "trainplan.cli.main", "estimate", *flags, "--gpu", accelerator,
           "--format", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env())
    if p.returncode:
        return {"error": p.stderr.strip()[-500:]}
    d = json.loads(p.stdout)
    return {"fits": d["fits"], "device_used_bytes": d["per_device"]["device_used_bytes"],
            "max_batch_size": d["max_batch_size"]}


def run(args) -> int:
    runs = matrix(args.full_precision, args.only, args.allocator, args.matrix)
    out = Path(args.out) if args.out else default_out()
    failures = out.with_suffix(".failures.jsonl")
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--out", str(out),
              "--format", "json"]
    if args.profile or args.matrix == "profile":
        common.append("--profile")
    if args.accelerator:
        common += ["--accelerator", args.accelerator]
    if args.dry_run:
        for label, flags in runs:
            print(f"# {label}\ntrainplan measure {shlex.join(flags + common)}")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device here: this matrix is meant for a GPU machine (--dry-run lists it)",
              file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    failed = 0
    for i, (label, flags) in enumerate(runs, 1):
        cmd = [sys.executable, "-m", "trainplan.cli.main", "measure", *flags, *common]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(),
                               timeout=args.timeout)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            rc, err = -1, f"timed out after {args.timeout} s"
        dt = time.time() - t0
        if rc == 0:
            rec = json.loads(p.stdout)
            m, pr = rec["measured"], rec.get("predicted") or {}
            err_t = (pr["device_step_time_s"] / m["step_time_s"] - 1
                     if pr.get("device_step_time_s") else None)
            print(f"[{i}/{len(runs)}] {label}: {m['step_time_s'] * 1e3:.1f} ms/step"
                  + (f", predicted {err_t:+.1%}" if err_t is not None else "") + f" ({dt:.0f} s)")
        else:
            failed += 1
            msg = err.strip().splitlines()[-12:]
            fail = {"label": label, "command": shlex.join(["trainplan", *cmd[3:]]), "rc": rc,
                    "error": "\n".join(msg), "oom": "out of device memory" in err
                    or "OutOfMemoryError" in err,
                    "predicted": predicted_fit(flags, args.accelerator or
                                               _accelerator_of(out))}
            with failures.open("a") as f:
                f.write(json.dumps(fail) + "\n")
            print(f"[{i}/{len(runs)}] {label}: FAILED ({'out of memory' if fail['oom'] else rc})")
    print(f"records: {out}" + (f"; {failed} failure(s): {failures}" if failed else ""))
    return 0


def _accelerator_of(out: Path) -> str | None:
    from trainplan.accelerators import load_accelerators
    return out.parent.name if out.parent.name in load_accelerators() else None


def repredicted(rec: dict) -> dict:
    """The record's job predicted again by this code, as `trainplan measure` predicts it."""
    import os
    from dataclasses import asdict
    from trainplan.measure.recorder import predict
    from trainplan.measure.records import job_from_record
    here = os.getcwd()
    os.chdir(ROOT)          # job files in the records are relative to the repository root
    try:
        return asdict(predict(job_from_record(rec), rec["accelerator"]))
    finally:
        os.chdir(here)


# a predicted step whose device waits on the host for more than this share of it rests on the
# host model (the summary's split of the step-time error)
HOST_WAIT_SHARE = 0.05


def summary(args) -> int:
    """Markdown table of predicted against measured, from the records only (with --repredict,
    the records' jobs predicted again by this code, beside the same measurements)."""
    from trainplan.measure.records import read_records
    from trainplan.units import fmt_bytes
    out = Path(args.out) if args.out else default_out()
    recs = read_records(out)
    if args.repredict:
        recs = [dict(r, predicted=repredicted(r)) for r in recs]
    how = ("predictions made again by this code on " + time.strftime("%Y-%m-%d")
           if args.repredict else "the predictions the records hold")
    flag = " --repredict" if args.repredict else ""
    lines = [f"# Predicted against measured: {out.parent.name}", "",
             f"Produced by `python scripts/measure_matrix.py --summary{flag} --out {out}` from "
             f"{len(recs)} records (`trainplan measure`, {recs[0]['device']['name']}, torch "
             f"{recs[0]['versions']['torch']}; {how}). Error = predicted / measured - 1. "
             "`host wait`: of the predicted step, the time the device waits on the host issuing "
             "its kernels (predict/host.py); the rest is the kernels' own time.", "",
             "| job | measured step | predicted step | error | host wait | measured peak alloc | "
             "predicted peak alloc | error | measured peak reserved | predicted peak reserved | "
             "measured device used | predicted device used |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    t_err, m_err, by_wait = [], [], {False: [], True: []}
    for r in recs:
        j, m, p = r["job"], r["measured"], r.get("predicted") or {}
        label = (f"{j['model']} b{j['batch_size']} {j['precision']} "
                 f"ckpt={j.get('grad_checkpointing', 'none')}"
                 + (f" lora r{j['lora']['rank']}" if j.get("lora") else "")
                 + (" expandable segments" if j.get("expandable_segments") else ""))
        et = p["device_step_time_s"] / m["step_time_s"] - 1 if p.get("device_step_time_s") else None
        em = (p["peak_allocated_bytes"] / m["peak_allocated_bytes"] - 1
              if p.get("peak_allocated_bytes") and m.get("peak_allocated_bytes") else None)
        wait = p.get("host_wait_s")
        if et is not None:
            t_err.append(abs(et))
            if wait is not None:
                by_wait[wait > HOST_WAIT_SHARE * p["device_step_time_s"]].append(abs(et))
        if em is not None:
            m_err.append(abs(em))
        lines.append(f"| {label} | {m['step_time_s'] * 1e3:.1f} ms | "
                     + (f"{p['device_step_time_s'] * 1e3:.1f} ms" if et is not None else "-")
                     + f" | {f'{et:+.1%}' if et is not None else '-'} | "
                     + (f"{wait * 1e3:.1f} ms" if wait is not None else "-") + " | "
                     f"{fmt_bytes(m.get('peak_allocated_bytes'))} | "
                     f"{fmt_bytes(p.get('peak_allocated_bytes'))} | "
                     f"{f'{em:+.1%}' if em is not None else '-'} | "
                     f"{fmt_bytes(m.get('peak_reserved_bytes'))} | "
                     f"{fmt_bytes(p.get('peak_reserved_bytes'))} | "
                     f"{fmt_bytes(m.get('device_used_bytes'))} | "
                     f"{fmt_bytes(p.get('device_used_bytes'))} |")
    lines += ["", f"Median absolute error: step time "
              f"{statistics.median(t_err):.1%} ({len(t_err)} runs; largest "
              f"{max(t_err):.1%})" if t_err else "",
              f"peak allocated {statistics.median(m_err):.1%} ({len(m_err)} runs)"
              if m_err else ""]
    if by_wait[False] and by_wait[True]:
        lines += ["", f"Step time, the runs predicted to wait on the host for at most "
                  f"{HOST_WAIT_SHARE:.0%} of the step (their kernels' time): median "
                  f"{statistics.median(by_wait[False]):.1%} ({len(by_wait[False])} runs); the "
                  f"runs predicted to wait longer: {statistics.median(by_wait[True]):.1%} "
                  f"({len(by_wait[True])} runs)"]
    lines += kernel_lines(recs)
    md = out.with_name("summary.md")
    md.write_text("\n".join(lines).rstrip() + "\n")
    print(md.read_text())
    return 0


def kernel_lines(recs: list[dict]) -> list[str]:
    """The profiled records' device time by kernel class, predicted against measured
    (measure/compare.py kernel_comparison): one row a record, one column a class."""
    from trainplan.measure.compare import kernel_comparison
    rows = [(r, kernel_comparison(r)) for r in recs]
    rows = [(r, k) for r, k in rows if k]
    if not rows:
        return []
    cols = []
    for _, k in rows:
        cols += [x.quantity.strip() for x in k if x.quantity.strip() not in cols]
    out = ["", "## Device time by kernel class (`measure --profile`)", "",
           "One profiled step a record (measure/profile.py): each cell predicted / measured "
           "milliseconds (error). `device idle`: the step beyond its kernels (the host issuing "
           "them, synchronisations).", "",
           "| job | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for r, k in rows:
        j = r["job"]
        by = {x.quantity.strip(): x for x in k}
        cell = []
        for c in cols:
            x = by.get(c)
            if x is None:
                cell.append("-")
                continue
            pred = f"{x.predicted * 1e3:.1f}" if x.predicted is not None else "-"
            err = f" ({x.error:+.0%})" if x.error is not None else ""
            cell.append(f"{pred} / {x.measured * 1e3:.1f}{err}")
        out.append(f"| {j['model']} b{j['batch_size']} {j['precision']} "
                   f"ckpt={j.get('grad_checkpointing', 'none')} | " + " | ".join(cell) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="records file (default validation/measured/<accelerator>/"
                                  "records.jsonl)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--accelerator", help="catalog id (default: detected)")
    ap.add_argument("--full-precision", choices=("auto", "fp32", "tf32"), default="auto")
    ap.add_argument("--only", action="append", default=[],
                    help="run only labels containing this text (repeatable)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--allocator", choices=tuple(ALLOCATORS), default="default",
                    help="the caching allocator's mode: default, expandable (segments), or both")
    ap.add_argument("--matrix", choices=("main", "profile"), default="main",
                    help="main: the 40 runs above; profile: PROFILE_MATRIX, each profiled")
    ap.add_argument("--profile", action="store_true",
                    help="run each job with `measure --profile` (device time by kernel class)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--summary", action="store_true", help="write summary.md from the records")
    ap.add_argument("--repredict", action="store_true",
                    help="with --summary: predict each record's job again with this code")
    args = ap.parse_args()
    return summary(args) if args.summary else run(args)


if __name__ == "__main__":
    sys.exit(main())
