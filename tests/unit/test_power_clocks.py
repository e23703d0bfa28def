"""benchmarks/power_clocks.py's window summary (CPU): which chunks and samples a row reads."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import power_clocks  # noqa: E402


def _samples(stamped):
    return lambda t0, t1: [s[1:] for s in stamped if t0 <= s[0] <= t1]


def test_summary_drops_the_first_third_and_reads_the_samples_of_the_rest():
    # 3 s window from t=0: chunks start at 0, 0.5, ..., 2.5 (1.0 ms a launch at first, the
    # clock settling, then 2.0); the samples before t=1 run at boost and uncapped.
    chunks = [(t, t + 0.5, 1.0 if t < 1 else 2.0) for t in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)]
    stamped = [
        (t / 10, 1980.0 if t < 10 else 1500.0, 600.0 if t < 10 else 690.0, 0 if t < 10 else 0x4)
        for t in range(31)
    ]
    w = power_clocks.summarize(chunks, _samples(stamped), t_start=0.0, seconds=3.0)
    assert w.ms == 2.0
    assert w.mhz == 1500.0 and w.watts == 690.0
    assert w.capped == 1.0 and w.thermal == 0.0


def test_summary_counts_the_share_of_capped_and_thermal_samples():
    chunks = [(2.0, 3.0, 1.5)]
    stamped = [(2.0, 1600.0, 700.0, 0x4), (2.5, 1600.0, 700.0, 0x20), (3.0, 1600.0, 700.0, 0)]
    w = power_clocks.summarize(chunks, _samples(stamped), t_start=0.0, seconds=3.0)
    assert w.capped == pytest.approx(1 / 3) and w.thermal == pytest.approx(1 / 3)


def test_summary_refuses_a_window_without_samples():
    with pytest.raises(RuntimeError, match="no NVML samples"):
        power_clocks.summarize([(2.0, 3.0, 1.0)], lambda t0, t1: [], t_start=0.0, seconds=3.0)


def test_idle_watts_skips_the_first_half_second():
    class FakeNvml:  # 300 W while settling, then 100 W
        def __init__(self):
            self.t0 = power_clocks.time.perf_counter()

        def sample(self):
            settling = power_clocks.time.perf_counter() - self.t0 < 0.4
            return 1980.0, 300.0 if settling else 100.0, 0

    with power_clocks.Sampler(FakeNvml(), period=0.005) as sampler:
        assert sampler.idle_watts(seconds=0.8) == pytest.approx(100.0)
