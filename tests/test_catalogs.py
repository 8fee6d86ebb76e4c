"""Accelerator and platform catalogs: ids, units, sources, and user-file validation."""
from __future__ import annotations

import re
from datetime import date

import pytest

from trainplan.accelerators import catalog_rows, get_accelerator, load_accelerators
from trainplan.errors import TrainplanError
from trainplan.platforms import get_platform, load_platforms, read_platforms_file

GiB = 2**30
HOUR = 3600

REQUIRED_IDS = [
    "t4", "p100", "v100-sxm2-16gb", "v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb",
    "a100-pcie-40gb", "a100-pcie-80gb", "a10g", "l4", "l40s", "h100-sxm", "h100-pcie", "h200",
    "rtx-3050", "rtx-3050-laptop-4gb", "rtx-3050-laptop-6gb", "rtx-3060", "rtx-3090", "rtx-4090",
    "rtx-a6000", "titan-rtx", "tpu-v2-8", "tpu-v3-8", "tpu-v5e-8", "tpu-v5e-1",
]
SOURCE_ID = re.compile(r"^(S|K)\d+$")


# --- accelerators -------------------------------------------------------------------------

@pytest.mark.parametrize("acc_id", REQUIRED_IDS)
def test_required_ids_resolve(acc_id):
    assert get_accelerator(acc_id).id == acc_id
    assert get_accelerator(acc_id.upper()).id == acc_id


@pytest.mark.parametrize("alias, acc_id", [
    ("tesla-t4", "t4"), ("Tesla-T4", "t4"), ("A100", "a100-sxm4-40gb"), ("a100-80gb", "a100-sxm4-80gb"),
    ("H100", "h100-sxm"), ("v100", "v100-sxm2-16gb"), ("3090", "rtx-3090"), ("rtx3090", "rtx-3090"),
    ("RTX 3090", "rtx-3090"), ("rtx_4090", "rtx-4090"), ("tpu-v5e", "tpu-v5e-8"), ("TPU-V3-8", "tpu-v3-8"),
])
def test_aliases_and_case(alias, acc_id):
    assert get_accelerator(alias).id == acc_id


def test_unknown_accelerator_suggests_close_matches():
    with pytest.raises(TrainplanError) as err:
        get_accelerator("a100-sxm")
    msg = str(err.value)
    assert "a100-sxm4-40gb" in msg and "a100-sxm4-80gb" in msg
    assert "trainplan catalog" in msg


def test_every_accelerator_row_is_sourced_and_dated():
    known = _source_ids()
    for acc in load_accelerators().values():
        assert acc.sources, acc.id
        assert set(acc.sources) <= known, (acc.id, set(acc.sources) - known)
        date.fromisoformat(acc.as_of)
        assert acc.choice_notes, acc.id


def test_numbers_positive_where_set():
    for acc in load_accelerators().values():
        assert acc.memory_bytes > 0 and acc.usable_memory_bytes > 0
        assert acc.memory_bandwidth_bytes_per_s > 0
        assert 0 < acc.sustained_clock_fraction <= 1
        for name in ("fp32_flops", "tf32_flops", "fp16_tensor_flops", "bf16_flops",
                     "fp16_nontensor_flops", "int8_ops", "interconnect_bytes_per_s", "tdp_watts"):
            value = getattr(acc, name)
            assert value is None or value >= 0, (acc.id, name)
        # every listed part trains in some 16-bit or 32-bit format
        assert acc.peak_flops("fp32") > 0, acc.id
        # units: bytes/s and FLOP/s, not GB/s or TFLOPS
        assert acc.memory_bandwidth_bytes_per_s > 1e10 and acc.peak_flops("fp32") > 1e12, acc.id


def test_tensor_rates_are_dense_not_sparse():
    assert get_accelerator("h100-sxm").peak_flops("bf16") == 989e12
    assert get_accelerator("a100-sxm4-40gb").peak_flops("bf16") == 312e12
    assert get_accelerator("l4").peak_flops("bf16") == 121e12


def test_tpu_memory_is_per_device():
    v3 = get_accelerator("tpu-v3-8")
    assert v3.devices_per_unit == 8
    assert v3.memory_per_device_bytes == 16 * GiB
    assert v3.usable_memory_bytes == 16 * GiB  # not the 128 GiB host total
    assert v3.unit_memory_bytes == 128 * GiB == v3.memory_bytes
    assert get_accelerator("tpu-v5e-8").peak_flops("bf16") == 197e12  # per chip, not x8
    assert get_accelerator("tpu-v2-8").memory_per_device_bytes == 8 * GiB
    for acc in load_accelerators().values():
        if acc.kind == "gpu":
            assert acc.devices_per_unit == 1 and acc.memory_bytes == acc.memory_per_device_bytes


def test_t4_facts():
    t4 = get_accelerator("t4")
    assert not t4.supports_bf16 and not t4.flash_attention_2
    assert t4.usable_memory_bytes == 16106127360
    assert t4.sustained_clock_fraction == pytest.approx(900 / 1590, abs=1e-3)
    assert t4.memory_bandwidth_bytes_per_s == 320e9


def test_peak_flops_semantics():
    t4, p100, a100, v100 = (get_accelerator(n) for n in ("t4", "p100", "a100", "v100"))
    # no bf16 on Turing: emulated at the FP32 rate (the compatibility rules report it)
    assert t4.peak_flops("bf16") == t4.peak_flops("fp32") and t4.rate("bf16") == (8.1e12, False)
    assert t4.peak_flops("tf32") == t4.peak_flops("fp32") == 8.1e12  # no TF32 on Turing
    assert t4.peak_flops("fp16") == 65e12
    # no tensor cores: PyTorch half GEMMs accumulate in fp32, at the FP32 FMA rate
    assert p100.peak_flops("fp16") == p100.fp32_flops == 9.3e12
    assert v100.peak_flops("bf16") == v100.fp32_flops
    assert a100.peak_flops("tf32") == 156e12 and a100.peak_flops("FP16") == 312e12
    tpu = get_accelerator("tpu-v3-8")              # XLA computes fp16 in bf16, on the MXU
    assert tpu.rate("fp16") == (tpu.peak_flops("bf16"), True)
    assert a100.rate("fp8") == (a100.fp32_flops, False)   # no FP8 tensor cores: not the FP8 rate
    with pytest.raises(TrainplanError):
        a100.peak_flops("fp8")


def test_geforce_ampere_uses_half_rate_fp32_accumulate():
    for name in ("rtx-3050", "rtx-3060", "rtx-3090", "rtx-3050-laptop-6gb"):
        acc = get_accelerator(name)
        assert acc.peak_flops("fp16") == pytest.approx(2 * acc.peak_flops("fp32"), rel=0.01), name


def test_catalog_rows_cover_everything():
    rows = catalog_rows()
    assert {r.id for r in rows} == set(load_accelerators())
    assert all(isinstance(r.usable_memory_bytes, int) for r in rows)


# --- platforms ----------------------------------------------------------------------------

def test_kaggle_t4x2_is_current_default():
    p = get_platform("kaggle-t4x2")
    assert p.status == "current" and p.accelerator_id == "t4" and p.accelerator_count == 2
    assert p.session_max_s == 12 * HOUR
    assert p.weekly_quota_s == 30 * HOUR and p.quota_kind == "gpu"
    assert p.usd_per_hour == 0 and p.devices == 2


def test_kaggle_tpu_v5e_is_current_with_8_devices():
    p = get_platform("KAGGLE-TPU-V5E-8")
    assert p.status == "current" and p.devices == 8 and p.session_max_s == 9 * HOUR
    assert p.quota_kind == "tpu"


def test_retired_platforms_keep_their_dates():
    p100 = get_platform("kaggle-p100")
    assert p100.status == "retired" and p100.retired_on == "2026-09-15"
    v3 = get_platform("kaggle-tpu-v3-8")
    assert v3.status == "retired" and v3.status_as_of


def test_colab_tpu_is_a_single_v5e_chip_since_october_2025():
    """S55: "Colab replaced TPU v2-8 with v5e-1" (2025-10-09): every tier's v2-8 row is retired on
    that date and a v5e-1 row (one chip, 16 GiB, no data parallelism across chips) is current."""
    for tier in ("pro", "proplus", "payg"):
        old, new = get_platform(f"colab-{tier}-tpu-v2-8"), get_platform(f"colab-{tier}-tpu-v5e-1")
        assert old.status == "retired" and old.retired_on == "2025-10-09" and "S55" in old.sources
        assert new.is_current and new.accelerator_id == "tpu-v5e-1" and "S55" in new.sources
    v5e1 = get_accelerator("tpu-v5e-1")
    assert v5e1.devices_per_unit == 1 and v5e1.memory_per_device_bytes == 16 * GiB
    assert v5e1.bf16_flops == get_accelerator("tpu-v5e-8").bf16_flops    # per chip, as the v5e-8's


def test_every_platform_row_is_sourced_priced_and_known():
    known = _source_ids()
    accs = load_accelerators()
    for p in load_platforms().values():
        assert p.sources and set(p.sources) <= known, p.id
        assert p.as_of, p.id
        assert p.accelerator_id in accs, p.id
        assert p.usd_per_hour >= 0, p.id


def test_colab_prices_come_from_compute_units():
    for p in load_platforms().values():
        if p.compute_units_per_hour is not None:
            assert p.usd_per_hour == pytest.approx(p.compute_units_per_hour * p.usd_per_compute_unit, abs=1e-4)


def test_unknown_platform_suggests_close_matches():
    with pytest.raises(TrainplanError, match="kaggle-t4x2"):
        get_platform("kaggle-t4")


# --- user platforms file ------------------------------------------------------------------

GOOD = """\
- id: lab-a6000x2
  name: Lab workstation
  accelerator_id: RTX-A6000
  accelerator_count: 2
  usd_per_hour: 0
- id: kaggle-t4x2
  name: Kaggle with a better quota
  accelerator_id: t4
  accelerator_count: 2
  usd_per_hour: 0
  weekly_quota_s: 144000
"""


def _write(tmp_path, text):
    path = tmp_path / "platforms.yaml"
    path.write_text(text)
    return str(path)


def test_user_file_adds_and_overrides(tmp_path):
    path = _write(tmp_path, GOOD)
    platforms = load_platforms(path)
    assert platforms["lab-a6000x2"].accelerator_id == "rtx-a6000"
    assert platforms["kaggle-t4x2"].weekly_quota_s == 144000
    assert "aws-p4d.24xlarge" in platforms
    assert get_platform("kaggle-t4x2").weekly_quota_s == 30 * HOUR  # built-ins untouched


@pytest.mark.parametrize("text, line, words", [
    (GOOD.replace("RTX-A6000", "rtx-a600"), 3, ["rtx-a6000"]),                      # unknown accelerator
    (GOOD.replace("weekly_quota_s: 144000", "usd_per_hour_x: 1"), 11, ["usd_per_hour"]),  # unknown field
    (GOOD.replace("  usd_per_hour: 0\n- id: kaggle", "  usd_per_hour: -1.5\n- id: kaggle"), 5, [">= 0"]),
    (GOOD.replace("  accelerator_count: 2\n  usd_per_hour: 0\n- id", "  usd_per_hour: 0\n- id"), 1, ["accelerator_count"]),
    (GOOD.replace("accelerator_count: 2\n  usd_per_hour: 0\n  weekly", "accelerator_count: two\n  usd_per_hour: 0\n  weekly"), 9, ["accelerator_count"]),
    (GOOD + "- id: lab-a6000x2\n  name: again\n  accelerator_id: t4\n  accelerator_count: 1\n  usd_per_hour: 0\n", 12, ["already defined"]),
    ("id: x\nname: y\n", 1, ["list of platforms"]),
    ("- id: x\n  name: [unclosed\n", None, ["not valid YAML"]),
])
def test_bad_user_file_names_file_and_line(tmp_path, text, line, words):
    path = _write(tmp_path, text)
    with pytest.raises(TrainplanError) as err:
        load_platforms(path)
    msg = str(err.value)
    assert path in msg
    if line is not None:
        assert f"{path}:{line}:" in msg, msg
    for w in words:
        assert w in msg, msg


def test_missing_user_file_is_a_trainplan_error(tmp_path):
    with pytest.raises(TrainplanError, match="Cannot read"):
        read_platforms_file(str(tmp_path / "nope.yaml"))


def _source_ids() -> set[str]:
    from importlib import resources
    text = resources.files("trainplan").joinpath("data").joinpath("SOURCES.md").read_text(encoding="utf-8")
    return set(re.findall(r"^- \*\*((?:S|K)\d+)\*\*", text, flags=re.M))
