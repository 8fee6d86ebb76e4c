"""The verdict bands (src/trainplan/data/fit_bands.json) from the memory validation's numeric rows
(validation/results/memory_rows.json, written by scripts/validate_memory.py, which also calls
this at its end). What a band is and how a job takes one: src/trainplan/predict/bands.py.

    PYTHONPATH=src python scripts/fit_bands.py [--check]

`--check`: exit 1 when the bundled file differs from what the rows give (tests run the same
comparison).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "validation" / "results" / "memory_rows.json"
OUT = ROOT / "src" / "trainplan" / "data" / "fit_bands.json"
# A cell with fewer rows borrows a wider one (bands.py). A new run's shortfall exceeds every one
# of n validated runs' with probability 1 / (n + 1) (exchangeable runs), so n runs bound its 95th
# percentile from their own spread only from n = 19: below that a cell's p95 is its largest row
# or less, and 5 close rows would give a band near 0 (QLoRA's five, after issue 39's release
# rules), which says more about how few they are than about the next run.
MIN_ROWS = 19
QUANTILE = 95


def shortfall(row: dict) -> float:
    """measured / predicted - 1: how much more the run needed than predicted."""
    return row["measured"] / row["predicted"] - 1.0


def _cell(errors: list[float]) -> dict:
    errors = sorted(round(e, 5) for e in errors)
    p = float(np.percentile(errors, QUANTILE)) if errors else 0.0
    return {"rows": len(errors), "p95": round(p, 5), "median": round(float(np.median(errors)), 5)
            if errors else 0.0, "errors": errors}


def compute(rows_doc: dict) -> dict:
    """The bands file from the rows document (deterministic: no clock read here)."""
    rows = rows_doc["rows"]
    cells: dict[str, dict[str, list[float]]] = {}
    regimes: dict[str, list[float]] = {}
    for r in rows:
        e = shortfall(r)
        cells.setdefault(r["regime"], {}).setdefault(r["device_class"], []).append(e)
        regimes.setdefault(r["regime"], []).append(e)
    return {
        "as_of": rows_doc["as_of"],
        "source": f"validation/results/memory_rows.json ({len(rows)} numeric rows of "
                  f"scripts/validate_memory.py, run {rows_doc['as_of']} on {rows_doc['machine']})",
        "script": "scripts/fit_bands.py",
        "definition": "shortfall e = measured / predicted - 1 per validated run; a cell's band "
                      "is the 95th percentile of its shortfalls (numpy linear interpolation), "
                      "floored at 0 where it is used (predict/bands.py)",
        "min_rows": MIN_ROWS,
        "quantile": QUANTILE / 100,
        "pooled": _cell([shortfall(r) for r in rows]),
        "regimes": {k: _cell(v) for k, v in sorted(regimes.items())},
        "cells": {k: {c: _cell(v) for c, v in sorted(d.items())} for k, d in sorted(cells.items())},
    }


def write(doc: dict, path: Path = OUT) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    args = ap.parse_args()
    doc = compute(json.loads(ROWS.read_text()))
    if args.check:
        same = json.loads(OUT.read_text()) == doc
        print("fit_bands.json matches the rows" if same else "fit_bands.json is stale: run "
              "PYTHONPATH=src python scripts/fit_bands.py")
        return 0 if same else 1
    write(doc)
    print(f"wrote {OUT.relative_to(ROOT)}: " + ", ".join(
        f"{k} {v['p95']:+.1%} ({v['rows']})" for k, v in doc["regimes"].items())
        + f"; pooled {doc['pooled']['p95']:+.1%} ({doc['pooled']['rows']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
