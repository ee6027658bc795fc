"""Resuming mid-epoch: the first batch after ``load_state_dict`` at the middle of a one-million-sample epoch.

A warm in-process ``loader.Loader`` (workers started, files in the page cache)
reads half of an epoch of 1,000,000 samples (64 float32 and an int64 label,
20 ``.npy`` files) and takes its ``state_dict()``; a second ``Loader`` of the
same config then loads the state and the time from ``epoch()`` to its first
batch is measured, against the first batch of a fresh epoch on the same warm
loader (the peer). Resuming reads only from the window the position lies in,
so both should be about the same. Target: under 1 s.

Run alone: ``.venv/bin/python scripts/bench_resume.py [--quick]``; the driver runs it as group ``resume``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

TARGET_S = 1.0
FILES = 20


def _write(directory: Path, samples: int) -> None:
    rng = np.random.default_rng(0)
    per_file = samples // FILES
    for i in range(FILES):
        np.save(directory / f"part-{i:02d}.npy", rng.standard_normal((per_file, 64), dtype=np.float32))
        np.save(directory / f"part-{i:02d}.label.npy", np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64))


def _config(directory: Path) -> Any:
    from loader.config import LoaderConfig

    return LoaderConfig.from_dict(
        {
            "source": {"files": [str(directory / "part-*.npy")]},
            "pipeline": {"batch_size": 256, "shuffle_buffer": 4096, "seed": 0},
            "workers": {"count": 2},
        }
    )


def _first_batch_s(data: Any) -> float:
    started = time.perf_counter()
    batches = data.epoch()
    next(batches)
    elapsed = time.perf_counter() - started
    batches.close()
    return elapsed


def measure(samples: int, tries: int) -> dict[str, Any]:
    import loader

    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        directory = Path(tmp)
        _write(directory, samples)
        config = _config(directory)
        with loader.Loader(config) as first:
            batches = first.epoch()
            half = samples // 2 // 256
            for _ in range(half):
                next(batches)
            state = first.state_dict()
            batches.close()
        resumed, fresh = [], []
        with loader.Loader(config) as second:
            for _ in range(tries):
                fresh.append(_first_batch_s(second))  # also warms the workers and the page cache
                second.load_state_dict(state)
                resumed.append(_first_batch_s(second))
    ours, peer = statistics.median(resumed), statistics.median(fresh)
    return {
        "name": f"resume at sample {state['position']:,} of {samples:,}: first batch",
        "ours": ours,
        "peer": peer,
        "unit": "s",
        "ratio": ours / peer if peer else float("inf"),
        "target": f"< {TARGET_S:g} s",
        "passed": ours < TARGET_S,
        "detail": (
            "peer: first batch of a fresh epoch on the same warm Loader; "
            f"resumed {', '.join(f'{t * 1000:.0f}' for t in resumed)} ms, "
            f"fresh {', '.join(f'{t * 1000:.0f}' for t in fresh)} ms"
        ),
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    return [measure(100_000 if quick else 1_000_000, 3 if quick else 5)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 samples instead of 1,000,000")
    args = parser.parse_args(argv)
    for row in run(quick=args.quick):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
