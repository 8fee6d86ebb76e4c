"""The GEMM model (predict/kernels.py) against measured GEMM times, shape by shape.

Run: PYTHONPATH=src python scripts/gemm_table.py [--fit GPU]

Rows: validation/data/xla_gemm.csv, OpenXLA's default matmul performance table (a batched dot
[b, m, k] x [b, k, n] compiled by XLA, which autotunes among cuBLAS and Triton kernels; each
FLOP/s the median kernel time of 5 runs, read by a kernel tracer: no launch or host time;
xla/tools/matmul_perf_table_gen.cc). Provenance: validation/PROVENANCE.md.

Each row is predicted as predict/timing.py `op_times` predicts a GEMM of that shape: the
fastest tile and split-K of kernels.gemm_seconds at the device's bf16 rate (catalog peak x
sustained clock x its measured matmul ceiling), never faster than its operands' and output's
bytes at the STREAM fraction of the bandwidth, plus the fixed time of any kernel (`kernel_s`);
with --fit, a GEMM kernel's own fixed time besides (`gemm_kernel_s`, which the bundled model does
not have: 0). The bundled parameters are printed first; with --fit GPU the three GEMM parameters
(`gemm_kernel_s`, a wave's fixed time `tile_s`, the tile size at half efficiency
`tile_h_half`) are fitted on that GPU's rows alone and checked on every other GPU's.
docs/validation.md ("GEMMs measured one by one") says what these give and why the bundled model
does not take them.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
ROWS = ROOT / "validation" / "data" / "xla_gemm.csv"

from trainplan.accelerators import get_accelerator, kernel_facts  # noqa: E402
from trainplan.predict import kernels  # noqa: E402
from trainplan.predict.time_params import bundled  # noqa: E402
from trainplan.predict.timing import matmul_ceiling  # noqa: E402


def load(dtype: str = "bf16xbf16->bf16") -> dict[str, np.ndarray]:
    """gpu -> array of (b, m, n, k, measured FLOP/s) rows of one dtype."""
    out: dict[str, list] = {}
    with open(ROWS) as f:
        for r in csv.DictReader(f):
            if r["dtype"] == dtype:
                out.setdefault(r["gpu"], []).append(
                    [float(r[c]) for c in ("b", "m", "n", "k", "flops_per_s")])
    return {g: np.asarray(v) for g, v in out.items()}


class Gemms(NamedTuple):
    """One GPU's rows, with what no GEMM parameter changes: its SMs, its bf16 rate at the
    measured ceiling, the tile-and-split grid (kernels.gemm_grid), the bandwidth at the STREAM
    fraction, each GEMM's bytes and its measured seconds."""

    sms: int
    rate: np.ndarray
    grid: kernels.GemmGrid
    bw: float
    nbytes: np.ndarray
    measured_s: np.ndarray


def gemms(gpu: str, rows: np.ndarray, p) -> Gemms:
    accel = get_accelerator(gpu)
    sms = kernel_facts(accel).sm_count
    peak, _ = accel.rate("bf16")
    rate = peak * accel.sustained_clock_fraction * matmul_ceiling(accel, p)
    b, m, n, k, flops_s = rows.T
    return Gemms(sms, np.full(len(rows), rate), kernels.gemm_grid(rows[:, :4], sms),
                 accel.memory_bandwidth_bytes_per_s * p.bw_eff,
                 2.0 * b * (m * k + k * n + m * n), 2.0 * b * m * n * k / flops_s)


def _errors(g: Gemms, gemm_kernel_s: float, tile_s: float, h_half: float, p) -> np.ndarray:
    """Predicted (module docstring) / measured seconds - 1 of each GEMM."""
    t = kernels.gemm_seconds(g.grid, g.rate, g.sms, tile_s, h_half, g.bw)
    return (np.maximum(t + gemm_kernel_s, g.nbytes / g.bw) + p.kernel_s) / g.measured_s - 1.0


def errors(gpu: str, rows: np.ndarray, gemm_kernel_s: float, tile_s: float, h_half: float
           ) -> np.ndarray:
    """Predicted / measured time - 1 for each row."""
    p = bundled()
    return _errors(gemms(gpu, rows, p), gemm_kernel_s, tile_s, h_half, p)


def summary(e: np.ndarray) -> str:
    a = np.abs(e)
    return (f"{len(e)} GEMMs, median |error| {np.median(a):.1%}, p90 {np.quantile(a, 0.9):.1%}, "
            f"median signed {np.median(e):+.1%}")


def fit(gpu: str, rows: np.ndarray) -> tuple[float, float, float]:
    """(gemm_kernel_s, tile_s, tile_h_half) minimising the mean |log(predicted / measured)| on
    `rows`: a log-spaced grid over the three (0 included for the two times)."""
    p = bundled()
    g = gemms(gpu, rows, p)
    times = np.concatenate([[0.0], np.geomspace(1e-7, 3e-5, 31)])
    best = (np.inf, 0.0, 0.0, 0.0)
    for ks in times:
        for ts in times:
            for hh in np.geomspace(0.5, 256, 28):
                loss = float(np.mean(np.abs(np.log1p(_errors(g, ks, ts, hh, p)))))
                if loss < best[0]:
                    best = (loss, ks, ts, hh)
    return best[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", help="fit tile_s and tile_h_half on this GPU's rows")
    args = ap.parse_args()
    p = bundled()
    data = load()
    print(f"bundled: tile_s {p.tile_s * 1e6:.2f} us, tile_h_half {p.tile_h_half:.1f}, no GEMM "
          f"kernel time of its own")
    for gpu, rows in sorted(data.items()):
        print(f"  {gpu}: {summary(errors(gpu, rows, 0.0, p.tile_s, p.tile_h_half))}")
    if args.fit:
        ks, ts, hh = fit(args.fit, data[args.fit])
        print(f"fitted on {args.fit}: gemm_kernel_s {ks * 1e6:.2f} us, tile_s {ts * 1e6:.2f} us, "
              f"tile_h_half {hh:.2f}")
        for gpu, rows in sorted(data.items()):
            tag = "fitted on" if gpu == args.fit else "checked on"
            print(f"  {tag} {gpu}: {summary(errors(gpu, rows, ks, ts, hh))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
