"""Predicted vs published decode throughput; writes validation/results/generation_validation.md.

Every row of validation/data/published_generation.csv (sources and how each was read:
validation/data/published_generation.md) becomes a job -- the row's model, GPU, precision,
attention and batch -- and is predicted by predict/generation.py's `estimate_generation` with the
bundled efficiency parameters (data/efficiency.json). Nothing is fitted here: the generation model
has no generation-specific factor and this script must not add one.

The compared number is the row's `metric`:
  output_tokens_per_s   completion tokens per second over the whole generate call (prefill
                        included), batch x completion_len / wall time = GenerationEstimate.tokens_per_s
  ms_per_output_token   1000 / that
  total_tokens_per_s    (prompt + completion tokens) / wall time, as the Qwen3 speed benchmark
                        defines its speed: the same wall time, so batch x completion_len /
                        (batch x (prompt_len + completion_len) / value)

Engines: `hf` and `vllm` are predict/generation.py's; a row of another engine names the one whose
model it is predicted with (ENGINE_MODEL: SGLang replays CUDA graphs over a paged KV cache, as
vLLM does) and is reported under its own name.

Error = (predicted - measured) / measured on tokens/s (+: predicted too fast). Traces are read
from, and written to, the trace store (TRAINPLAN_TRACE_CACHE, default validation/.cache/gen_traces).

    PYTHONPATH=src python scripts/validate_generation.py
"""
from __future__ import annotations

import csv
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DATA = ROOT / "validation" / "data" / "published_generation.csv"
OUT = ROOT / "validation" / "results" / "generation_validation.md"
os.environ.setdefault("TRAINPLAN_TRACE_CACHE", str(ROOT / "validation" / ".cache" / "gen_traces"))

from trainplan.accelerators import get_accelerator  # noqa: E402
from trainplan.predict.generation import estimate_generation  # noqa: E402
from trainplan.spec import Job, validate  # noqa: E402


ENGINE_MODEL = {"hf": "hf", "vllm": "vllm", "sglang": "vllm"}
# transformers' SDPA attention copied grouped-query K/V to every query head (`repeat_kv`) until
# 4.54 (huggingface/transformers#39412, July 2025), which passes them grouped with `enable_gqa`;
# its flash_attention_2 path, vLLM's and SGLang's kernels never copied them
# (trace/semantics.py `expands_kv`)
GROUPED_SDPA_FROM = "2025-07-15"


def kernels(row: dict) -> dict:
    """KernelSemantics fields the row's stack sets over today's: an `hf` row on transformers'
    SDPA path published before GROUPED_SDPA_FROM ran `repeat_kv`."""
    old_sdpa = row["engine"] == "hf" and row.get("attention") != "flash" and \
        row["date"] < GROUPED_SDPA_FROM
    return {"expands_kv": True} if old_sdpa else {}


def load_rows(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def measured_tokens_per_s(row: dict) -> float:
    v = float(row["value"])
    if row["metric"] == "output_tokens_per_s":
        return v
    if row["metric"] == "ms_per_output_token":
        return int(row["batch"]) * 1000.0 / v
    if row["metric"] == "total_tokens_per_s":
        p, c = int(row["prompt_len"]), int(row["completion_len"])
        return v * c / (p + c)
    raise ValueError(f"unknown metric {row['metric']!r}")


def predict(row: dict):
    job = validate(Job(model=row["model"], batch_size=int(row["batch"]),
                       seq_len=int(row["prompt_len"]), precision=row["precision"],
                       attention=row.get("attention") or "auto", gpu=row["gpu"]))
    return estimate_generation(job, get_accelerator(row["gpu"]), prompts=int(row["batch"]),
                               prompt_len=int(row["prompt_len"]),
                               completion_len=int(row["completion_len"]),
                               engine=ENGINE_MODEL[row["engine"]], kernels=kernels(row))


def stats(errs) -> tuple[int, float, float, float]:
    e = np.asarray(errs, dtype=float)
    if not len(e):
        return 0, float("nan"), float("nan"), float("nan")
    return len(e), float(np.median(np.abs(e))), float(np.percentile(np.abs(e), 90)), \
        float(np.median(e))


def main() -> int:
    rows = load_rows()
    t_start = time.time()
    results = []
    for r in rows:
        t0 = time.time()
        g = predict(r)
        meas = measured_tokens_per_s(r)
        err = (g.tokens_per_s - meas) / meas
        results.append((r, g, meas, err))
        print(f"{r['id']:<28} {r['engine']:<4} pred {g.tokens_per_s:9.2f} tok/s  meas {meas:9.2f}  "
              f"err {err:+7.1%}  bound {g.bound}  ({time.time() - t0:.1f} s)", flush=True)
    took = time.time() - t_start

    lines = [
        "# Generation model: predicted vs published decode throughput", "",
        f"Generated by `PYTHONPATH=src python scripts/validate_generation.py` on "
        f"{dt.date.today().isoformat()} on a {platform.machine()} machine with "
        f"{os.cpu_count()} CPU cores ({took:.0f} s, trace store "
        f"`{os.environ['TRAINPLAN_TRACE_CACHE']}`). Rows: "
        "`validation/data/published_generation.csv` (how each was read: "
        "`validation/data/published_generation.md`). Predictions use the bundled "
        "`data/efficiency.json` as is: **no fitting** (the generation model has no generation-specific "
        "factor). Error = (predicted - measured) / measured output tokens/s (+: predicted too fast). "
        "`ops/step`: aten ops with bytes or FLOPs in one traced decode step (what engine hf "
        "issues through the host/device queue, predict/host.py); `implied host us/op` (hf rows): measured seconds per step "
        "(batch / measured tok/s, prefill included) / ops per step, the per-op host cost that "
        "would reproduce the measurement if the step were host-bound.",
        "", "## Summary", "",
        "| rows | n | median abs err | p90 abs err | median signed err |", "|---|---|---|---|---|"]
    groups = [("all", results)] + [(f"engine: {e}", [x for x in results if x[0]["engine"] == e])
                                    for e in dict.fromkeys(x[0]["engine"] for x in results)]
    groups += [(f"source: {s}", [x for x in results if x[0]["id"].split("-")[0] == s])
               for s in dict.fromkeys(x[0]["id"].split("-")[0] for x in results)]
    for name, sub in groups:
        n, med, p90, sgn = stats([x[3] for x in sub])
        lines.append(f"| {name} | {n} | {med:.1%} | {p90:.1%} | {sgn:+.1%} |")
    lines += ["", "## Rows", "",
              "| id | engine | gpu | model | prec | batch | prompt | completion | measured tok/s | "
              "predicted tok/s | error | predicted ms/step (first, last) | prefill s | ops/step | "
              "implied host us/op | bound |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, g, meas, err in results:
        ops = g.steps["decode_first"].ops if "decode_first" in g.steps else g.steps["prefill"].ops
        # what one dispatched op would have cost on the host if the measured step were host-bound
        # (hf rows; measured wall time per step, prefill left in, over the traced ops of a step)
        implied = (f"{int(r['batch']) / meas / ops * 1e6:.1f}" if r["engine"] == "hf" else "")
        lines.append(
            f"| {r['id']} | {r['engine']} | {r['gpu']} | {r['model']} | {r['precision']} | "
            f"{r['batch']} | {r['prompt_len']} | {r['completion_len']} | {meas:.2f} | "
            f"{g.tokens_per_s:.2f} | {err:+.1%} | {g.per_token_s_first * 1e3:.2f}, "
            f"{g.per_token_s_last * 1e3:.2f} | {g.prefill_s:.3f} | {ops} | {implied} | {g.bound} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[lines.index("## Summary"):lines.index("## Rows")]))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
