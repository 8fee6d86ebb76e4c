"""Physics checks of the step-time model on small traced models (GPT-2 124M)."""
from __future__ import annotations

import csv
import functools
import time
from importlib import resources

import pytest
import torch

from trainplan.accelerators import get_accelerator
from trainplan.spec import Job, validate
from trainplan.timing import collective_s, estimate_step_time, link_fraction
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

GPT2 = "hf:openai-community/gpt2"
AMP = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}


def catalog_ids() -> list[str]:
    text = resources.files("trainplan.data").joinpath("accelerators.csv").read_text()
    return [r["id"] for r in csv.DictReader(text.splitlines())]


def job(precision="fp16-amp", batch=16, seq=1024, **kw):
    return validate(Job(model=GPT2, batch_size=batch, seq_len=seq, precision=precision,
                        optimizer="adamw", **kw))


@functools.lru_cache(maxsize=None)
def trace(precision="fp16-amp", batch=16, seq=1024):
    sem = KernelSemantics(attention="efficient", autocast_dtype=AMP.get(precision))
    return trace_step(job(precision, batch, seq), sem)


def step(accel, precision="fp16-amp", batch=16, **kw):
    return estimate_step_time(trace(precision, batch), get_accelerator(accel),
                              job(precision, batch, **kw))


def test_never_beats_peak_on_any_accelerator():
    for precision in ("fp16-amp", "fp32"):
        for acc in catalog_ids():
            st = step(acc, precision)
            assert st.mfu is None or 0 < st.mfu <= 1.0, (acc, precision, st.mfu)
            assert st.step_time_s > 0
            parts = st.breakdown_s
            assert set(parts) == {"compute", "memory_bound", "communication", "optimizer",
                                  "data_wait", "overhead"}
            assert st.step_time_s == pytest.approx(sum(parts.values()), rel=1e-9)


def test_all_accelerators_fast():
    tr = trace()
    j = job()
    accels = [get_accelerator(a) for a in catalog_ids()]
    t0 = time.perf_counter()
    for a in accels:
        estimate_step_time(tr, a, j)
    assert time.perf_counter() - t0 < 2.0


def test_doubling_batch_doubles_compute_bound_step():
    # GPT-2 in fp32 on a T4 (4.6 TFLOP/s sustained on CUDA cores) is compute-bound
    small, big = step("t4", "fp32", batch=16), step("t4", "fp32", batch=32)
    assert small.bound == "compute"
    assert 1.8 <= big.step_time_s / small.step_time_s <= 2.1


def test_pcie_t4_pair_scales_worse_than_nvlink_a100_pair():
    def speedup(acc):
        one = step(acc)
        two = step(acc, gpus=2, strategy="ddp")
        return two.samples_per_s / one.samples_per_s
    s_t4, s_a100 = speedup("t4"), speedup("a100-sxm4-40gb")
    assert s_t4 < s_a100 <= 2.0
    assert s_a100 > 1.9


def test_t4_fp32_much_slower_than_fp16_amp():
    assert step("t4", "fp32").step_time_s > 3 * step("t4", "fp16-amp").step_time_s


def test_p100_has_no_tensor_core_speedup():
    p100 = step("p100", "fp32").step_time_s / step("p100", "fp16-amp").step_time_s
    v100 = step("v100", "fp32").step_time_s / step("v100", "fp16-amp").step_time_s
    assert p100 <= 2.2          # fp16 on CUDA cores is 2x fp32 at best (18.7 vs 9.3 TFLOPS)
    assert v100 > p100 * 1.5


def test_all_reduce_closed_form():
    for acc in ("a100-sxm4-40gb", "t4", "tpu-v3-8"):
        a = get_accelerator(acc)
        for n in (2, 4, 8):
            got = collective_s("all_reduce", 1e9, n, a)
            want = 2 * (n - 1) / n * 1e9 / (a.interconnect_bytes_per_s * link_fraction(a))
            assert got == pytest.approx(want, rel=1e-12)
    assert collective_s("all_reduce", 1e9, 1, get_accelerator("t4")) == 0.0


def test_data_pipeline_bound():
    st = step("a100-sxm4-40gb", num_workers=2, samples_per_s_per_worker=10.0)
    assert st.bound == "data"
    assert st.samples_per_s == pytest.approx(20.0, rel=1e-6)


def test_tpu_reports_compile_time():
    assert step("tpu-v3-8", "bf16-amp").xla_compile_s > 0
    assert step("a100", "bf16-amp").xla_compile_s is None
