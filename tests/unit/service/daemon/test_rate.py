"""RecentRate: the status rate reflects the last seconds, not the lifetime average."""

from __future__ import annotations

import pytest

from loader.service.daemon.rate import RecentRate


def test_rate_follows_recent_readings_and_forgets_old_ones():
    rate = RecentRate(window_s=10.0, interval_s=0.5)
    assert rate.per_second(0.0, 0) == 0.0
    for second in range(0, 21):  # 1000 samples/s for 20 s
        rate.record(float(second), second * 1000)
    assert rate.per_second(20.0, 20_000) == pytest.approx(1000.0)
    for second in range(21, 41):  # then idle for 20 s
        rate.record(float(second), 20_000)
    assert rate.per_second(40.0, 20_000) == 0.0


def test_readings_closer_than_the_interval_are_ignored():
    rate = RecentRate(window_s=10.0, interval_s=1.0)
    rate.record(0.0, 0)
    rate.record(0.1, 500)  # too soon: the first reading stays the base
    assert rate.per_second(2.0, 1000) == pytest.approx(500.0)
