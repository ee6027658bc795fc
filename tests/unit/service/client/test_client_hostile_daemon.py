"""A client against a daemon that sends what no daemon should: each ends the client with one line naming the
daemon's address, or is dropped, and never grows what the client holds (docs/security.md, "A client against
its daemon")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import pytest

from loader.errors import TransportError
from loader.service import protocol as P
from loader.service.client.client import Client
from loader.service.shm import refs as R
from loader.service.shm.file_rows import RowFiles, file_id
from loader.service.shm.pool import ArenaPool
from loader.service.transport import FakeChannel
from tests.helpers import REPO_ROOT, wait_until

Serve = Callable[[Any, P.Epoch], None]


def _client(serve: Serve, **welcome: Any) -> Client:
    """A client whose daemon answers hello (a welcome of ``welcome``'s fields where given) and then, at the
    first EPOCH, does ``serve(channel, epoch)``."""
    near, far = FakeChannel.pair()
    fields = {"session": 1, "batch_size": 1, "batch_format": "stacked", "files": 1, "ping_s": 0.5, **welcome}

    def daemon() -> None:
        while True:
            frames = far.recv(5.0)
            if frames is None:
                return
            message, _ = P.decode(frames)
            if isinstance(message, P.ClientHello):
                far.send(P.encode(P.ClientWelcome(**fields)))
            elif isinstance(message, P.Epoch):
                serve(far, message)
                return

    threading.Thread(target=daemon, daemon=True).start()
    return Client("fake://daemon", channel=near, prefetch=2, timeout_s=5.0)


@pytest.mark.parametrize("frames", [[b"\x93not msgpack"], [msgpack.packb({"k": "nonsense"})]])
def test_a_message_that_does_not_decode_ends_the_client_naming_the_daemon(frames):
    with _client(lambda far, epoch: far.send(frames)) as client:
        with pytest.raises(TransportError, match=r"^the loader daemon at fake://daemon sent a malformed message: "):
            list(client.epoch())


def test_ends_and_errors_beyond_the_one_that_ends_a_request_are_not_queued():
    """What a client queues is bounded by its prefetch whatever a daemon sends: an END or ERROR takes no credit,
    and a daemon sending them in a loop filled the consumer's queue (100,000 items while it trained)."""

    def flood(far: Any, epoch: P.Epoch) -> None:
        far.send(P.encode(P.Batch(gen=epoch.gen, epoch=0, count=1), {"x": np.zeros(1)}))
        for _ in range(2000):
            far.send(P.encode(P.End(gen=epoch.gen, epoch=0)))
            far.send(P.encode(P.Error(gen=epoch.gen, message="again")))
            far.send(P.encode(P.Error(message="a refusal of no request")))
        far.send(P.encode(P.Pong()))  # the last message: once it is read, every one before it was

    with _client(flood) as client:
        batches = client.epoch()
        next(batches)
        assert wait_until(lambda: client._out.qsize() >= 1 and not client._channel._inbox.qsize(), timeout_s=10)
        time.sleep(0.3)  # the receiver's last round
        assert client._out.qsize() <= 2, client._out.qsize()
        assert list(batches) == []  # the first END ended the epoch


@pytest.mark.parametrize(("count", "columns", "held"), [(2, {}, "no columns"), (0, {"x": np.zeros(0)}, "1 column(s)")])
def test_a_batch_of_no_rows_or_no_columns_ends_the_client_naming_the_daemon(count, columns, held):
    # A batch of no columns reached the training loop as {} (columns of other lengths than the count fail to decode).
    def serve(far: Any, epoch: P.Epoch) -> None:
        far.send(P.encode(P.Batch(gen=epoch.gen, epoch=0, count=count), columns))

    with _client(serve) as client:
        message = f"the loader daemon at fake://daemon sent a batch of {count} rows in {held}"
        with pytest.raises(TransportError, match=f"^{re.escape(message)}$"):
            list(client.epoch())


@pytest.mark.parametrize(
    ("count", "parts", "columns"),
    [
        (2, None, {"x": np.zeros(2)}),
        (3, [[1, 1], [2, 3]], {"x": np.zeros(3)}),  # a packed batch: its second part is over
        # Rows of no bytes cost the daemon nothing to claim: with batch_format = "list" the client built a sample
        # per row of 10**12 without end.
        (10**12, None, {"x": np.zeros((10**12, 0))}),
    ],
)
def test_a_batch_of_more_rows_than_the_welcomes_batch_size_ends_the_client_naming_the_daemon(count, parts, columns):
    def serve(far: Any, epoch: P.Epoch) -> None:
        far.send(P.encode(P.Batch(gen=epoch.gen, epoch=0, count=count, parts=parts), columns))

    with _client(serve) as client:  # a welcome of batch_size 1
        largest = count if parts is None else max(p[0] for p in parts)
        message = f"the loader daemon at fake://daemon sent a batch of {largest} rows, more than its "
        with pytest.raises(TransportError, match=f"^{re.escape(message)}batch_size of 1$"):
            list(client.epoch())


def test_a_welcome_of_a_batch_size_no_config_allows_is_refused_naming_the_daemon():
    near, far = FakeChannel.pair()

    def daemon() -> None:
        if far.recv(5.0) is not None:
            welcome = P.ClientWelcome(session=1, batch_size=P.MAX_INT - 1, batch_format="list", files=1, ping_s=0.5)
            far.send(P.encode(welcome))

    threading.Thread(target=daemon, daemon=True).start()
    with pytest.raises(TransportError, match=r"^the loader daemon at fake://daemon sent a welcome of batch_size \d+"):
        Client("fake://daemon", channel=near, timeout_s=5.0)


class Flooded(FakeChannel):
    """A client end that never runs dry once ``flooding`` is set: whatever the daemon sent, then messages of no
    request (which the client drops), as from a daemon that sends them without a pause."""

    flooding = False

    def recv(self, timeout_s: float) -> list[Any] | None:
        frames = super().recv(timeout_s)
        if frames is None and self.flooding:
            self._waker.wake()
            return P.encode(P.End(epoch=0))
        return frames


def test_a_daemon_that_sends_without_a_pause_keeps_the_receiver_from_nothing_else():
    """The receiver took such messages one after another and never came back to its other work: the epoch was
    never asked for (the loop waited out progress_timeout_s) and a closed client's receiver went on."""
    near, far = Flooded.pair()

    def daemon() -> None:
        while (frames := far.recv(5.0)) is not None:
            message = P.decode(frames)[0]
            if isinstance(message, P.ClientHello):
                far.send(
                    P.encode(P.ClientWelcome(session=1, batch_size=1, batch_format="stacked", files=1, ping_s=0.5))
                )
            elif isinstance(message, P.Epoch):
                far.send(P.encode(P.Batch(gen=message.gen, epoch=0, count=1), {"x": np.zeros(1)}))
                far.send(P.encode(P.End(gen=message.gen, epoch=0)))

    threading.Thread(target=daemon, daemon=True).start()
    client = Client("fake://daemon", channel=near, timeout_s=5.0, progress_timeout_s=3.0)
    near.flooding = True
    try:
        with client:
            assert len(list(client.epoch())) == 1
        assert not client._thread.is_alive()
    finally:
        near.flooding = False
        client._thread.join(5.0)


def _receiver(pool: ArenaPool) -> Any:
    """The receiver's side of a client that maps the daemon's arenas (its ArenaCache gives arenas by id)."""
    empty = lambda n: np.empty(n, np.uint8)  # noqa: E731
    return SimpleNamespace(address="tcp://daemon:1", _arenas=pool, _gather_into=empty)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, object, bool])
def test_a_reference_column_that_is_not_integers_ends_the_client_naming_the_daemon(tmp_path, dtype):
    # The daemon refuses such a column from a worker; a client took floats as references, and a complex column
    # raised numpy's own TypeError out of its receiver thread.
    with ArenaPool(4 << 20, directory=str(tmp_path)) as pool:
        values = np.ones((2, 100_000), np.float32)
        refs = R.write_column(pool.create(), values)
        described = {"x": {0: [values.dtype.str, [100_000]]}}
        with pytest.raises(TransportError, match=r"reference column 'x' from tcp://daemon:1 is missing or malformed"):
            Client._gather(_receiver(pool), described, {"x": refs.astype(dtype)}, {})  # type: ignore[arg-type]


def test_a_reference_column_of_narrow_integers_is_read_as_references(tmp_path):
    # Integers of any width name the same rows (the daemon takes them from a worker so): an int8 column raised
    # numpy's OverflowError while its block offsets were computed in int8.
    with ArenaPool(4 << 20, directory=str(tmp_path)) as pool:
        values = np.arange(2 * 100_000, dtype=np.float32).reshape(2, 100_000)
        refs = R.write_column(pool.create(), values)
        columns = {"x": refs.astype(np.int8)}
        Client._gather(_receiver(pool), {"x": {0: [values.dtype.str, [100_000]]}}, columns, {})  # type: ignore[arg-type]
        assert np.array_equal(columns["x"], values)


def _gather_in_a_child(tmp_path: Any, setup: str) -> str:
    """What ``Client._gather`` says of a batch of two 400 KB arena rows, in a child process (which a SIGBUS or a
    descriptor limit takes, not this one): ``setup`` runs with ``pool``, ``arena``, ``refs`` and ``values`` made and
    leaves ``receiver``. The child's standard output: the TransportError's line."""
    body = "\n".join("    " + line for line in setup.strip().splitlines())
    script = f"""
import os
import resource
import numpy as np
from loader.errors import TransportError
from loader.service.client.client import Client
from loader.service.shm import refs as R
from loader.service.shm.cache import ArenaCache
from loader.service.shm.pool import ArenaPool
from tests.unit.service.client.test_client_hostile_daemon import _receiver

with ArenaPool(4 << 20, directory={str(tmp_path)!r}) as pool:
    values = np.ones((2, 100_000), np.float32)
    arena = pool.create()
    refs = R.write_column(arena, values)
{body}
    try:
        Client._gather(receiver, {{"x": {{0: [values.dtype.str, [100_000]]}}}}, {{"x": refs}}, {{}})
    except TransportError as exc:
        print(exc)
"""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    return done.stdout


def test_rows_of_an_arena_truncated_under_the_client_end_it_naming_the_daemon_and_do_not_kill_it(tmp_path):
    # Mapped at an earlier batch, then truncated by whoever can write it: the copy read past the file's end and
    # the training process died of SIGBUS. Run in a child, which is all such a death takes.
    said = _gather_in_a_child(
        tmp_path,
        """
cache = ArenaCache(pool.describe())
cache.get(arena.arena_id)
os.truncate(arena.path, 4096)
receiver = _receiver(cache)
""",
    )
    assert said.startswith("the loader daemon at tcp://daemon:1 sent a bad batch: a reference claims a row")


def test_an_arena_that_cannot_be_mapped_for_want_of_descriptors_ends_the_client_naming_the_daemon(tmp_path):
    # A daemon naming arenas without end takes a descriptor and a mapping (which dups it) for each: where the last
    # descriptor went to the open, the mapping's OSError left the receiver thread as it was. In a child, whose
    # descriptors it takes.
    said = _gather_in_a_child(
        tmp_path,
        """
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
receiver = _receiver(ArenaCache(pool.describe()))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    os.close(held.pop())  # one left: the arena's open takes it
""",
    )
    assert said.startswith("the loader daemon at tcp://daemon:1 sent a bad batch: cannot map arena "), said


def test_file_rows_of_more_bytes_than_the_client_can_allocate_end_it_naming_the_daemon(tmp_path):
    # A sparse .npy of two rows of 1 GiB, as anyone can make one and a daemon name it: what a row is, is what its
    # header says. Where the memory is not there, numpy's MemoryError (or mmap's OSError, for a batch buffer)
    # left the receiver thread as it was. This process's allocation refuses them here, so nothing is allocated.
    path = str(tmp_path / "sparse.npy")
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (2, 1 << 28)})
        offset = f.tell()
    os.truncate(path, offset + 2 * (1 << 30))
    st = os.stat(path)

    def empty(nbytes: int) -> np.ndarray:
        if nbytes > 1 << 20:
            raise MemoryError(f"Unable to allocate {nbytes} bytes")
        return np.empty(nbytes, np.uint8)

    receiver = SimpleNamespace(address="tcp://daemon:1", _arenas=object(), _row_files=RowFiles(), _gather_into=empty)
    refs = np.array([[file_id(0), 0, 0], [file_id(0), 1, 0]], np.int64)
    files = {0: [path, "data", st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]}
    message = "the loader daemon at tcp://daemon:1 sent a batch this client cannot gather: Unable to allocate"
    try:
        with pytest.raises(TransportError, match=f"^{re.escape(message)}"):
            Client._gather(receiver, {"x": {0: ["<f4", [1 << 28]]}}, {"x": refs}, files)  # type: ignore[arg-type]
    finally:
        receiver._row_files.close()


def test_a_welcome_of_no_ping_interval_does_not_make_the_client_ping_in_a_loop():
    with _client(lambda far, epoch: None, ping_s=0.0) as client:
        assert client._ping_interval_s >= 0.01  # the least any config allows


def test_a_column_of_a_structured_dtype_ends_the_client_naming_the_daemon(monkeypatch):
    # "i4,i4" on the wire decodes as a structured array. No stage sends one (it refuses them from workers), and
    # such a column reached the training loop.
    from loader.service import frames as F

    real = F._column_frame

    def structured(values: Any) -> Any:
        dtype, shape, frame = real(values)
        return ("i4,i4" if dtype == "|V8" else dtype), shape, frame

    monkeypatch.setattr(F, "_column_frame", structured)

    def serve(far: Any, epoch: P.Epoch) -> None:
        far.send(P.encode(P.Batch(gen=epoch.gen, epoch=0, count=1), {"x": np.zeros(1, "V8")}))

    with _client(serve) as client:
        with pytest.raises(
            TransportError, match=r"^the loader daemon at fake://daemon sent column 'x' of a structured dtype \("
        ):
            list(client.epoch())
