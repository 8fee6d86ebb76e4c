"""Multi-GPU rows' step-time error against the share of the step the model hides collectives in
(issue 38: are overlapped collectives free?).

Run: python scripts/comm_share.py     (traces what validation/.cache lacks: ~10 min on 2 cores)

For every published row of the sources with multi-GPU runs (NVIDIA DLE, IBM fms-acceleration and
fms-fsdp, llm-foundry, torchtitan), the bundled fit's prediction (in-sample, as
scripts/calibrate_time.py makes it) and the step's collectives as predict/comm.py times them
with nothing hidden (`exposed_comm` with empty compute windows), as a share of the predicted
step. Prints the median error and share per source, model kind, GPU, device count, strategy and
accumulation, then, for the LLM rows on several GPUs, the error by share of the step and the
slope of error against share through the origin.
"""
from __future__ import annotations

import collections
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate_time as cal  # noqa: E402

SOURCES = ("dle", "fms-acceleration-a100", "fms-fsdp", "llm-foundry", "torchtitan")
LLM = ("fms-fsdp", "llm-foundry", "torchtitan")


def main() -> int:
    import trainplan.predict.timing as timing
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.time_params import bundled
    seen = {}
    real = timing.exposed_comm

    def recorded(job, accel, meta, n, t_fwd, t_bwd, *rest):
        seen["all"] = real(job, accel, meta, n, 0.0, 0.0)[0]
        return real(job, accel, meta, n, t_fwd, t_bwd, *rest)

    timing.exposed_comm = recorded
    rows = [r for r in cal.all_rows() if r["source"] in SOURCES and r.get("split", "fit") == "fit"]
    tables = cal.load_tables(rows)
    params = bundled()
    out = []
    for r in rows:
        seen.clear()
        predicted = cal.predict(r, tables, params)
        if not predicted:
            continue
        step = timing.estimate_step_time(tables[cal.trace_key(r)]["_obj"],
                                         get_accelerator(r["gpu"]), cal._job_cache(r),
                                         calibration=params).step_time_s
        kind = "BERT" if "BERT" in r["label"] else "convnet" if r["source"] == "dle" else "LLM"
        out.append(dict(row=r, kind=kind, err=100 * (predicted / r["measured"] - 1),
                        share=seen.get("all", 0.0) / step))
    groups = collections.defaultdict(list)
    for o in out:
        r = o["row"]
        groups[(r["source"], o["kind"], r["gpu"], "x1" if r["n"] == 1 else "multi",
                r["strategy"], "accum" if r["accum"] > 1 else "-")].append(o)
    print("source, kind, GPU, devices, strategy, accumulation: rows, median error, median share")
    for key in sorted(groups):
        v = groups[key]
        print(f"  {', '.join(key)}: {len(v)}, {statistics.median(o['err'] for o in v):+.1f}%, "
              f"{statistics.median(o['share'] for o in v):.3f}")
    llm = [(o["share"], o["err"]) for o in out if o["row"]["n"] > 1 and o["row"]["source"] in LLM]
    by = collections.defaultdict(list)
    for share, err in llm:
        by[min(int(share * 20), 6)].append(err)
    print(f"LLM rows on several GPUs ({len(llm)}), by the step's share in collectives:")
    for b in sorted(by):
        print(f"  {b / 20:.2f}-{(b + 1) / 20:.2f}: {len(by[b])} rows, median error "
              f"{statistics.median(by[b]):+.1f}%")
    slope = sum(s * e for s, e in llm) / max(sum(s * s for s, _ in llm), 1e-12)
    print(f"  slope through the origin: {slope / 100:.2f} of a point of error per point of share")
    return 0


if __name__ == "__main__":
    sys.exit(main())
