"""Cost (plan/cost.py) and checkpoint storage (plan/storage.py) on hand-computed cases."""
from types import SimpleNamespace

import pytest

from trainplan.strategy import parse as parse_strategy
from trainplan.plan import cost, storage
from trainplan.platforms import get_platform

H = 3600.0
DAY = 86400.0


def test_free_tier_and_owned_hardware_cost_nothing():
    for pid in ("kaggle-t4x2", "local-rtx-3050"):
        c = cost.run_cost(get_platform(pid), 100 * H, 10 * DAY)
        assert c.total_usd == 0 and c.months == 0 and c.subscription_usd == 0


def test_cloud_on_demand_is_hours_times_price():
    p = get_platform("aws-g4dn.xlarge")            # $0.526/h (S33)
    c = cost.run_cost(p, 3 * H, 3 * H)
    assert c.accelerator_hours == 3 and c.total_usd == pytest.approx(3 * 0.526)
    assert c.compute_units is None


def test_colab_pro_includes_100_compute_units_a_month():
    p = get_platform("colab-pro-t4")               # 1.96 CU/h x $0.0999, $9.99/month incl. 100 CU
    included = p.usd_per_month / p.usd_per_compute_unit
    assert included == pytest.approx(100, abs=0.01)
    small = cost.run_cost(p, 10 * H, 10 * H)       # 19.6 CU: inside the subscription
    assert small.compute_units == pytest.approx(19.6)
    assert small.total_usd == pytest.approx(9.99) and small.months == 1
    big = cost.run_cost(p, 100 * H, 5 * DAY)       # 196 CU: 96 CU bought on top
    assert big.total_usd == pytest.approx(9.99 + (196 - included) * 0.0999, abs=0.01)
    two = cost.run_cost(p, 10 * H, 40 * DAY)       # spans two months: two fees
    assert two.months == 2 and two.total_usd == pytest.approx(2 * 9.99)


def test_colab_pay_as_you_go_has_no_fee():
    p = get_platform("colab-payg-a100")            # 13.08 CU/h
    c = cost.run_cost(p, 2 * H, 2 * H)
    assert c.months == 0 and c.total_usd == pytest.approx(2 * 13.08 * 0.0999, abs=1e-3)


def _trace(weights, trainable, states):
    return SimpleNamespace(weight_bytes=weights, trainable_param_bytes=trainable,
                           optimizer_state_bytes=states)


def test_checkpoint_is_weights_plus_state_or_adapters_only():
    # 138M parameters under AMP: fp32 weights 552 MB + AdamW moments 1104 MB
    tr = _trace(551_844_864, 551_844_864, 1_103_689_728)
    assert storage.checkpoint_parts(tr, lora=False) == (551_844_864, 1_103_689_728)
    # LoRA: 18.6M adapter parameters in fp32 + their moments; the frozen base is not saved
    lo = _trace(7_500_000_000, 74_305_536, 148_611_072)
    assert storage.checkpoint_parts(lo, lora=True) == (74_305_536, 148_611_072)


def test_files_per_checkpoint_and_limits():
    assert storage.files_per_checkpoint(parse_strategy("ddp"), 2) == 1
    assert storage.files_per_checkpoint(parse_strategy("zero3"), 1) == 1
    assert storage.files_per_checkpoint(parse_strategy("zero2"), 2) == 4        # 2 optimizer shards + model + tag
    assert storage.files_per_checkpoint(parse_strategy("zero3"), 2) == 5        # 2 x (model + optimizer) + tag
    assert storage.checkpoints_that_fit(1_655_534_592, 20_000_000_000) == 12
    assert storage.checkpoints_that_fit(1, None) is None
    assert storage.checkpoints_within_file_limit(5, 500) == 100
    assert storage.checkpoints_within_file_limit(5, None) is None
