"""What the metrics endpoint costs: the small-sample workload with ``service.metrics`` on and off.

::

    .venv/bin/python scripts/bench_metrics.py [--trials 6] [--epochs 30]

The same daemon config (``scripts/bench_service.py``'s small-sample case: npz files of 64
float32 + an int64 label, batch 256, 2 workers) is run with metrics off and on, alternating,
the "on" side scraped every second. Per side: the median samples/s over the trials, and the
daemon process's own CPU seconds per million samples (its loop, not its workers), which a
loaded machine disturbs less than wall time. The target is a cost under 2%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_service import CLIENT_TIMEOUT_S, Daemon, Scraper, rows_in

from loader.examples import datagen


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (not its children), from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(work: str, files: list[str], *, metrics: bool, epochs: int) -> tuple[float, float]:
    """(samples per second, daemon CPU seconds per million samples)."""
    from loader.service.client.client import Client

    with Daemon(work, files, batch_size=256, workers=2, metrics=metrics) as daemon:
        with Client(daemon.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            for batch in client.epoch():  # warm-up
                rows_in(batch)
            scraper = Scraper(daemon.metrics) if metrics else None
            cpu0, start, samples = cpu_seconds(daemon.proc.pid), time.perf_counter(), 0
            for _ in range(epochs):
                for batch in client.epoch():
                    samples += rows_in(batch)
            seconds, cpu = time.perf_counter() - start, cpu_seconds(daemon.proc.pid) - cpu0
            if scraper is not None:
                scraper.close()
    return samples / seconds, cpu / samples * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args(argv)
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="loader-bench-metrics-") as work:
        files = datagen.generate(os.path.join(work, "small"), format="npz", files=4, samples=16384, dim=64)
        for trial in range(args.trials):
            for metrics in (False, True) if trial % 2 == 0 else (True, False):
                runs[metrics].append(one_run(work, files, metrics=metrics, epochs=args.epochs))
                rate, cpu = runs[metrics][-1]
                print(
                    f"trial {trial} metrics {'on ' if metrics else 'off'}: {rate:,.0f} samples/s, {cpu:.3f} daemon CPU s/M"
                )
    rate = {side: statistics.median(r for r, _ in runs[side]) for side in runs}
    cpu = {side: statistics.median(c for _, c in runs[side]) for side in runs}
    print(f"median samples/s: off {rate[False]:,.0f}, on {rate[True]:,.0f}: on/off {rate[True] / rate[False]:.3f}")
    print(
        f"median daemon CPU s per M samples: off {cpu[False]:.3f}, on {cpu[True]:.3f}: on/off {cpu[True] / cpu[False]:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
