"""llm-foundry's MPT rows as they ran: do they fit, and does the step-time error grow with the
share of the device a row uses?

Each row is estimated as Composer ran it (FSDP, its micro-batch and accumulation, every
micro-batch's gradients reduce-scattered: `sync_each_batch`) and, for comparison, as accelerate
would run it (no_sync: every unsharded gradient held to the last micro-batch). Its step time is
predicted with the bundled fit (data/efficiency.json) from the calibration's op tables
(scripts/calibrate_time.py traces what is missing). Prints the fit counts of MPT-13B/30B/70B and
the median signed time error by memory share (required bytes / capacity); docs/validation.md
("Gradient accumulation as each trainer syncs it") quotes it.

    PYTHONPATH=src python scripts/mpt_headroom.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import calibrate_time as cal  # noqa: E402

BANDS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0), (1.0, 9.9))


def main() -> None:
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.evaluate import step_memory
    from trainplan.predict.time_params import bundled
    from trainplan.trace.derive.traces import Traces
    rows, tables = cal.prepare()
    rows = [r for r in rows if r["source"] == "llm-foundry"]
    traces, params = Traces(), bundled()
    big = {"as run": [0, 0], "under no_sync": [0, 0]}
    use, err = [], []
    for r in rows:
        accel = get_accelerator(r["gpu"])
        mems = {}
        for name, sync in (("as run", True), ("under no_sync", False)):
            job = cal.make_job(dict(r, sync_each_batch=sync), r["n"], "fsdp", r["accum"])
            mems[name] = step_memory(job, accel, traces)[1]
            if r["model"] in ("mpt-13b", "mpt-30b", "mpt-70b"):
                big[name][0] += 1
                big[name][1] += bool(mems[name].fits)
        mem = mems["as run"]
        p = cal.predict(r, tables, params)
        if p:
            use.append(mem.required_bytes / mem.capacity_bytes)
            err.append(p / r["measured"] - 1)
        if r["model"] in ("mpt-13b", "mpt-30b", "mpt-70b") and not mem.fits:
            print(f"does not fit as run: {r['label']}: {mem.required_bytes / 2**30:.1f} GiB "
                  f"of {mem.capacity_bytes / 2**30:.2f}")
    for name, (n, fits) in big.items():
        print(f"MPT-13B/30B/70B {name}: {fits} of {n} rows fit")
    use, err = np.array(use), np.array(err)
    print(f"{len(err)} rows with a prediction; correlation of memory share and signed time "
          f"error {np.corrcoef(use, err)[0, 1]:+.2f}")
    for lo, hi in BANDS:
        m = (use >= lo) & (use < hi)
        if m.any():
            print(f"  share {lo:.1f}-{min(hi, 9):.1f}: {int(m.sum()):3d} rows, median signed error "
                  f"{np.median(err[m]):+.1%}")


if __name__ == "__main__":
    main()
