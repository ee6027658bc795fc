"""``BatchBuffers``: memory for big gathered batches, reused only once every view of a batch is gone."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np

from loader.service.client.buffers import BatchBuffers

MIB = 1024 * 1024


def test_a_dropped_batch_gives_its_memory_to_the_next_of_its_size():
    buffers = BatchBuffers(max_bytes=64 * MIB, min_bytes=MIB)
    first = buffers.empty(8 * MIB)
    first[:] = 7
    address = first.ctypes.data
    del first
    second = buffers.empty(8 * MIB)
    assert buffers.reused == 1 and second.ctypes.data == address
    assert second.flags.writeable and second.dtype == np.uint8 and second.shape == (8 * MIB,)
    other_size = buffers.empty(4 * MIB)  # nothing of that size waits
    assert buffers.reused == 1 and other_size.shape == (4 * MIB,)


def test_memory_is_never_reused_while_any_view_of_a_batch_lives():
    buffers = BatchBuffers(max_bytes=64 * MIB, min_bytes=MIB)
    batch = buffers.empty(2 * MIB).view(np.float32).reshape(8, -1)
    batch[:] = 1.0
    row = batch[3]  # what a training loop may keep (a view)
    held = memoryview(batch[5])
    del batch
    gc.collect()
    fresh = [buffers.empty(2 * MIB) for _ in range(3)]
    for array in fresh:
        array[:] = 0xFF
    assert buffers.reused == 0
    assert np.all(row == 1.0) and np.all(np.frombuffer(held, np.float32) == 1.0)
    del row, held
    fresh.clear()
    assert buffers.empty(2 * MIB) is not None and buffers.reused == 1


def test_idle_memory_is_bounded_and_small_batches_are_not_pooled():
    buffers = BatchBuffers(max_bytes=3 * MIB, min_bytes=MIB)
    batches = [buffers.empty(MIB) for _ in range(5)]
    del batches
    assert buffers.idle_bytes == 3 * MIB
    small = buffers.empty(MIB - 1)
    del small
    assert buffers.idle_bytes == 3 * MIB
    buffers.close()
    assert buffers.idle_bytes == 0
    late = buffers.empty(MIB)  # still served after close, never kept
    del late
    assert buffers.idle_bytes == 0


def test_batches_dropped_on_other_threads_come_back_once_each():
    buffers = BatchBuffers(max_bytes=256 * MIB, min_bytes=MIB)
    handed = [buffers.empty(MIB) for _ in range(64)]
    for i, array in enumerate(handed):
        array[:8] = i
    del array

    def drop(some: list[np.ndarray]) -> None:
        some.clear()

    threads = [threading.Thread(target=drop, args=(handed[i::4],)) for i in range(4)]
    handed.clear()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert buffers.idle_bytes == 64 * MIB
    again = [buffers.empty(MIB) for _ in range(64)]
    assert buffers.reused == 64 and len({a.ctypes.data for a in again}) == 64


def test_a_forked_child_keeps_its_copy_of_a_batch_when_the_parent_reuses_the_memory():
    buffers = BatchBuffers(max_bytes=64 * MIB, min_bytes=MIB)
    batch = buffers.empty(MIB)
    batch[:] = 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the parent to reuse the memory, then report what it sees
        try:
            os.close(write)
            os.read(read, 1)
            os._exit(0 if int(batch.min()) == 1 == int(batch.max()) else 1)
        finally:
            os._exit(2)
    os.close(read)
    del batch
    reused = buffers.empty(MIB)
    reused[:] = 9
    assert buffers.reused == 1
    os.write(write, b"x")
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
