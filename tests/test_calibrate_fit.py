"""scripts/calibrate_time.py's fit: a parameter no training row depends on keeps its START value.

A fold of the cross-validation (scripts/validate_time.py) refits every parameter without one
source; where that source held the only rows a parameter acts on (DLE's fp32 V100 rows and the
CUDA-core convolutions' `cuda_emax`), nothing pins it, and what the held-out rows are predicted
with must be the prior, not wherever Nelder-Mead's steps left it. Checked on a stand-in
objective whose dependence is known.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cal():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("calibrate_time",
                                                      ROOT / "scripts" / "calibrate_time.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return mod


def test_only_parameters_the_rows_depend_on_are_fitted(cal, monkeypatch):
    names = list(cal.PARAMS)
    informed = {"host_scale": 5.0, "conv_rel": 0.6}         # where the stand-in rows pull them
    idx = {names.index(k): math.log(v) for k, v in informed.items()}

    def objective(x, rows, tables):
        return float(sum((x[i] - t) ** 2 for i, t in idx.items()))

    monkeypatch.setattr(cal, "objective", objective)
    x0 = np.log([cal.START[k] for k in names])
    assert sorted(cal.identified([], {}, x0).tolist()) == sorted(idx)
    params, loss = cal.fit([], {}, iters=400, restarts=1)
    assert loss < 1e-6
    for k, v in informed.items():
        assert getattr(params, k) == pytest.approx(v, rel=1e-2)
    for k in names:
        if k not in informed:          # exactly its start: the simplex never moved it
            assert getattr(params, k) == pytest.approx(cal.START[k], rel=1e-12)
