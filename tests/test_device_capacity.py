"""Capacity is what the driver reports (issue 39 item 1): nvidia-smi's total, with ECC on as the
clouds run the GDDR6 datacenter cards. Sources: modal-labs/modal-client PR #2797 and NVIDIA/DCGM
#232 (data/SOURCES.md S56), stored nvidia-smi logs (S101)."""
from __future__ import annotations

import pytest

from trainplan.accelerators import get_accelerator, load_accelerators

MiB = 2**20
GiB = 2**30


@pytest.mark.parametrize("acc_id, mib", [
    ("a10g", 23_028),      # NVIDIA/DCGM #232: "8722MiB / 23028MiB" on an AWS A10G
    ("a10", 23_028),       # modal-client #2797
    ("l4", 23_034),        # modal-client #2797
    ("l40s", 46_068),      # modal-client #2797
    ("h100-sxm", 81_559),  # modal-client #2797
    ("h200", 143_771),     # nvidia-smi on 8x H200 nodes (S101)
])
def test_capacity_is_the_driver_total(acc_id, mib):
    acc = get_accelerator(acc_id)
    assert acc.usable_memory_bytes == mib * MiB
    assert acc.usable_memory_bytes < acc.memory_per_device_bytes   # the nominal size is kept apart


def test_figures_equal_to_the_nominal_size_stay():
    # A100s report their whole binary size; the T4 keeps Kaggle's 16106127360 B = 15,360 MiB
    assert get_accelerator("a100-sxm4-40gb").usable_memory_bytes == 40 * GiB
    assert get_accelerator("a100-sxm4-80gb").usable_memory_bytes == 80 * GiB
    assert get_accelerator("t4").usable_memory_bytes == 16106127360 == 15_360 * MiB


def test_every_gpu_row_says_where_its_capacity_comes_from():
    said = ("apacity", "nvidia-smi", "total_memory", "recommendedMaxWorkingSetSize",
            "working set")
    for acc in load_accelerators().values():
        if acc.kind == "gpu":
            assert any(s in acc.choice_notes for s in said), acc.id
