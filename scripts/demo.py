"""The demo behind ``scripts/demo``: a dataset, a daemon, a client training a model, a clean stop.

1. write a few thousand labelled samples in several ``.npy`` files (features) with their
   ``.label.npy`` companions to a temp dir (``loader.examples.datagen``, as ``loader gen-data``);
2. start ``loader serve`` on them (a config written next to the data, a free port);
3. train a small numpy model (softmax regression) for two epochs on batches from
   ``loader.Client``, printing per epoch: batches, samples, the mean loss and accuracy, the
   epoch's wall time and samples/s, and the part of it the training loop spent waiting for data;
4. print ``loader status`` as a trainer's operator would see it;
5. stop the daemon with SIGTERM and check that it exits 0.

Every figure printed is measured in this run. ``--local`` trains on the same data in this
process with the reader toolkit (creator -> shuffle -> batch), without the service.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from loader.examples import datagen

FILES = 6
SAMPLES_PER_FILE = 1000
DIM = 64
BATCH_SIZE = 128
EPOCHS = 2
WORKERS = 2
SERVE_START_TIMEOUT_S = 20.0
SERVE_STOP_TIMEOUT_S = 15.0
STATUS_TIMEOUT_S = 5.0
LEARNING_RATE = 0.5

CONFIG = """\
# written by scripts/demo.py
[source]
files = ["part-*.npy"]

[pipeline]
batch_size = {batch_size}
shuffle_buffer = 2048
seed = 0
epochs = {epochs}

[workers]
count = {workers}

[service]
bind = "{bind}"
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SoftmaxRegression:
    """The demo's model: ``softmax(x @ w + b)``, trained by plain SGD on the cross-entropy."""

    def __init__(self, dim: int, classes: int, learning_rate: float = LEARNING_RATE) -> None:
        self.w = np.zeros((dim, classes), np.float64)
        self.b = np.zeros(classes, np.float64)
        self.learning_rate = learning_rate

    def step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """One SGD step on a batch; (mean loss, correct predictions) before the step."""
        logits = x @ self.w + self.b
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(-np.log(probs[rows, y] + 1e-12).mean())
        correct = int((probs.argmax(axis=1) == y).sum())
        grad = probs
        grad[rows, y] -= 1.0
        grad /= len(y)
        self.w -= self.learning_rate * (x.T @ grad)
        self.b -= self.learning_rate * grad.sum(axis=0)
        return loss, correct


def timed_epoch(batches: Iterable[Any], model: SoftmaxRegression | None = None) -> dict[str, Any]:
    """Consume (and train on) one epoch; what was measured."""
    count = samples = correct = 0
    loss_sum = waited = 0.0
    start = time.perf_counter()
    iterator = iter(batches)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        waited += time.perf_counter() - asked
        count += 1
        n = batch_length(batch)
        samples += n
        if model is not None:
            loss, right = model.step(np.asarray(batch["data"], np.float64), np.asarray(batch["label"]))
            loss_sum += loss * n
            correct += right
    seconds = time.perf_counter() - start
    return {
        "batches": count,
        "samples": samples,
        "seconds": seconds,
        "waited": waited,
        "loss": loss_sum,
        "correct": correct,
    }


def batch_length(batch: Any) -> int:
    """Samples in a batch: stacked (arrays / dict of arrays) or a list of samples."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, np.ndarray):
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], np.ndarray) and len(batch) < 8:
        return int(batch[0].shape[0])  # a list of per-slot arrays
    return len(batch)


def report(epoch: int, measured: dict[str, Any]) -> None:
    samples, seconds = measured["samples"], measured["seconds"]
    trained = ""
    if samples:
        trained = f", loss {measured['loss'] / samples:.3f}, accuracy {measured['correct'] / samples:.1%}"
    rate = samples / seconds if seconds > 0 else 0.0
    print(
        f"epoch {epoch}: {measured['batches']} batches, {samples} samples{trained}; "
        f"{seconds:.2f} s ({rate:,.0f} samples/s), of which {measured['waited']:.2f} s waiting for data"
    )


def run_local(data_dir: str) -> int:
    """The same pipeline in-process with the reader toolkit (no daemon)."""
    import loader
    from loader import reader

    files = sorted(p for p in os.listdir(data_dir) if p.endswith(".npy") and not p.endswith(".label.npy"))

    def rows() -> Iterable[tuple[np.ndarray, np.int64]]:
        for name in files:
            features = np.load(os.path.join(data_dir, name), mmap_mode="r")
            labels = np.load(os.path.join(data_dir, name[: -len(".npy")] + ".label.npy"), mmap_mode="r")
            yield from zip(features, labels)

    samples = loader.batch(reader.shuffle(rows, buf_size=2048, seed=0), BATCH_SIZE)

    def batches() -> Iterable[dict[str, np.ndarray]]:
        for batch in samples():
            yield {"data": np.stack([x for x, _ in batch]), "label": np.array([y for _, y in batch])}

    model = SoftmaxRegression(DIM, datagen.LABEL_CLASSES)
    for epoch in range(EPOCHS):
        report(epoch, timed_epoch(batches(), model))
    return 0


def run_service(data_dir: str) -> int:
    from loader.service.client.client import Client

    address = f"tcp://127.0.0.1:{free_port()}"
    config_path = os.path.join(data_dir, "demo.toml")
    with open(config_path, "w", encoding="utf-8") as fh:
        fh.write(CONFIG.format(batch_size=BATCH_SIZE, epochs=EPOCHS, workers=WORKERS, bind=address))
    print(f"$ loader serve {config_path}   (in the background)")
    daemon = start_daemon(config_path)
    try:
        wait_ready(address, daemon, WORKERS, SERVE_START_TIMEOUT_S)
        model = SoftmaxRegression(DIM, datagen.LABEL_CLASSES)
        with Client(address, timeout_s=30.0) as client:
            for epoch in range(EPOCHS):
                report(epoch, timed_epoch(client.epoch(), model))
        show_status(address)
        start = time.perf_counter()
        code = stop_daemon(daemon)
        print(f"daemon stopped by SIGTERM in {time.perf_counter() - start:.2f} s, exit code {code}")
        return 0 if code == 0 else 1
    finally:
        stop_daemon(daemon)  # on an error or an interrupt: the daemon never outlives the demo


# -- a daemon in a child process (scripts/bench_service.py uses these too) ----------------


class DaemonNotReady(RuntimeError):
    """``loader serve`` exited, or did not answer with its workers in time."""


def start_daemon(config_path: str) -> subprocess.Popen:
    """``loader serve CONFIG`` in a child process; stop it with ``stop_daemon``."""
    return subprocess.Popen([sys.executable, "-m", "loader.cli", "serve", config_path, "--log-level", "warning"])


def wait_ready(address: str, daemon: subprocess.Popen, workers: int, timeout_s: float) -> None:
    """Wait until the daemon answers and ``workers`` workers are connected (``DaemonNotReady`` if not)."""
    from loader.errors import LoaderError
    from loader.service.client.client import query_status

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise DaemonNotReady(f"loader serve exited with code {daemon.returncode}")
        try:
            status = query_status(address, timeout_s=0.5)
        except LoaderError:
            time.sleep(0.1)
            continue
        # Wait for the workers too, so a first epoch times reading, not process start-up.
        if sum(1 for w in status.get("workers", []) if w.get("connected")) >= workers:
            return
        time.sleep(0.05)
    raise DaemonNotReady(f"the daemon and its workers were not ready on {address} within {timeout_s:.0f} s")


def stop_daemon(daemon: subprocess.Popen) -> int:
    """SIGTERM (a clean stop), a bounded wait, then SIGKILL; returns the exit code."""
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=SERVE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=SERVE_STOP_TIMEOUT_S)
    return daemon.returncode


def show_status(address: str) -> None:
    print(f"$ loader status {address}")
    sys.stdout.flush()
    subprocess.run([sys.executable, "-m", "loader.cli", "status", address], timeout=STATUS_TIMEOUT_S * 3, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="run the pipeline in-process, without the daemon")
    args = parser.parse_args(argv)
    run: Callable[[str], int] = run_local if args.local else run_service
    # SIGTERM unwinds like Ctrl-C, so run_service's finally stops the daemon.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="loader-demo-") as data_dir:
        datagen.generate(data_dir, format="npy", files=FILES, samples=SAMPLES_PER_FILE, dim=DIM)
        total = FILES * SAMPLES_PER_FILE
        print(
            f"dataset: {FILES} .npy files (+ .label.npy), {total} samples of {DIM} float32 "
            f"and a label in 0..{datagen.LABEL_CLASSES - 1}, in {data_dir}"
        )
        try:
            return run(data_dir)
        except DaemonNotReady as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
