"""The trainer's side: ``Client`` receives batches from the daemon and double-buffers them.

A background receiver thread owns the socket: it asks for an epoch, receives
batches, decodes them (``np.frombuffer`` on the received frames: no copy) and
starts their placement (``Placer.stage``); the consumer's iterator finishes
placement (``Placer.finish``) and, for every message it has taken, returns one credit
to the daemon through a ``Waker`` so the receiver sends it at once. The daemon
sends at most ``prefetch`` messages ahead, so memory is bounded on both sides. A
message is one batch, or several small ones packed up to 1 MiB (``Batch.parts``):
the receiver splits it into views, one batch each, and the credit comes back
once the consumer has taken them all.

The receiver pings the daemon while idle (every ``PING_INTERVAL_S``, or the
daemon's heartbeat interval when shorter); a daemon silent for ``timeout_s``
(or one that says BYE) ends the iterator with ``ServiceUnavailableError``.
Worker failures arrive as ``WorkerError`` naming the file and the record.

Large rows may arrive as references into the daemon's shared-memory arenas
(``shm.refs``). The client says in each EPOCH whether it maps them (its
``ArenaCache.probe`` found the daemon's probe file with the daemon's token);
if so, the receiver copies each batch's referenced rows into one fresh array
per column as the batch arrives (``refs.gather``: the one copy of the fast
path, and where pinned memory could be used) and the daemon frees the blocks
once the consumer has taken the batch (the credit says so). Otherwise the
daemon sends those columns inline. A reference may also name a row of a local
``.npy``/``.npz`` file (``shm.file_rows``, the batch's ``files`` say which): the
receiver reads it from the page cache straight into the batch, after checking
the file's header and identity itself.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import queue
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from loader.config.address import address_origin, another_config, daemon_address
from loader.config.sections import MAX_BATCH_SIZE, MAX_PREFETCH, MIN_HEARTBEAT_INTERVAL_S
from loader.device import Placer
from loader.errors import (
    ClosedError,
    ConfigError,
    EpochStalledError,
    LoaderError,
    MalformedMessageError,
    ProtocolVersionError,
    ServiceUnavailableError,
    TransportError,
    WorkerError,
)
from loader.reader.batches import batch_reader
from loader.service import protocol as P
from loader.service import transport
from loader.service.blocks import block_nbytes
from loader.service.client.ask import ConnectJudge, query_status, request
from loader.service.client.batches import to_batch
from loader.service.client.buffers import BatchBuffers
from loader.service.client.checkpoint import Place, place_of
from loader.service.client.env import client_stats, from_environment
from loader.service.order import epoch_batches, window_rows
from loader.service.shm import refs as R
from loader.service.shm.arena import ArenaError, RowsNotKeptError
from loader.service.shm.cache import ArenaCache
from loader.service.shm.file_rows import FileRowsError, RowFiles, is_file_id, source_of
from loader.service.transport import Channel
from loader.service.transport.auth import peer_for

log = logging.getLogger("loader.client")

# The receiver thread watches the daemon's socket (``transport.PeerWatch``): what that needs is imported now, in
# the thread importing this module, not in the receiver thread while the training script may fork.
transport.load_peer_watch()

DEFAULT_PREFETCH = 4
# prefetch="auto" (the default): each epoch after the first reads ahead as many messages as fit in
# AUTO_PREFETCH_BYTES at the size of the largest message so far, between DEFAULT_PREFETCH and AUTO_PREFETCH_MAX.
# Big batches then wait fewer round trips (1 MiB rows, batch 8: 5.5-6.0 GB/s with 4 ahead, 7.0-7.2 with the 15 of
# "auto"; docs/performance.md) while a client of 38 MiB image batches still holds 4.
AUTO_PREFETCH_BYTES = 128 * 1024 * 1024
AUTO_PREFETCH_MAX = 16
DEFAULT_TIMEOUT_S = 30.0
# state_dict(held=...): the batches a loop may hold ahead of the step it trains (Lightning holds one).
MAX_HELD = 4
PING_INTERVAL_S = P.CLIENT_PING_S
# A batch's arena rows copied within this of the daemon's ``Batch.kept`` are refused too: the clocks of two
# processes of one host agree, but the daemon's reads early here by the welcome's time on its way.
KEPT_MARGIN_S = 0.25
RANK_RETRY_S = 0.25  # between hellos while the daemon says another client of the job holds this rank
# A daemon whose connection dropped and whose address refuses reconnecting this long is gone (killed, or
# stopped without a goodbye): found in seconds, not after timeout_s of silence. zmq retries every 0.1-0.2 s.
PEER_GONE_AFTER_S = 2.0
RECEIVER_POLL_S = 0.1
# On the way out the receiver says BYE and, when batches it gave credit for may still be on their way, takes
# in (and drops) what arrives until none has for CLOSE_QUIET_S, CLOSE_DRAIN_S at most, before it closes its
# socket. A socket closed while batches were still arriving left about 0.4 MiB of C memory in use for good, so a
# script that closed a client mid-epoch again and again grew without end; one closed with nothing in flight leaves
# nothing. heaptrack puts it in libzmq's I/O thread: blocks of about 34 KB it allocated as it received, never
# freed (37.8 MiB over 150 such clients; 0.9 MiB in all with the drain).
CLOSE_QUIET_S = 0.05
CLOSE_DRAIN_S = 0.25
THREAD_JOIN_TIMEOUT_S = 5.0
# The longest an epoch's iterator waits for its next batch from a daemon that answers pings but sends
# nothing. Longer than the daemon's own epoch stall timeout (3 * workers.progress_timeout_s, 360 s by
# default), which fails the epoch with its cause first; this one is for a daemon that cannot.
DEFAULT_PROGRESS_TIMEOUT_S = 600.0
# An iterator that waited this long for a batch says so once (a WARNING): the wait may last progress_timeout_s,
# and the daemon's log says why it waits (a rank not started, a blocked mapper) where the training script is not.
WAITING_NOTE_S = 30.0


class EpochBatches(Iterator[Any]):
    """The batches of one epoch, as ``Client.epoch()`` returns them: an iterator with a length.

    ``len()`` is the number of batches the epoch will have (for a learning-rate schedule or a
    progress bar) where the daemon can count it from file headers (``.npy``, ``.npz``, read within a
    second at the dataset's first client); otherwise ``len()`` raises ``TypeError``. With ``on_error = "skip"`` skipped records can make the epoch shorter.
    """

    def __init__(self, batches: Iterator[Any], length: int | None, epoch: int) -> None:
        self._batches, self._length, self.epoch = batches, length, epoch
        self._ended = self._warned = False

    def __iter__(self) -> EpochBatches:
        if self._ended and not self._warned:
            # A loop over it again (batches = data.epoch() kept, then iterated once per epoch) trained on nothing,
            # without a word: a generator's second pass is empty. A warning, not an error: extending a list with
            # an iterator already at its end (next() ran it there) is ordinary Python.
            self._warned = True
            warnings.warn(
                f"epoch {self.epoch}'s batches were all iterated already, so iterating them again gives none: an "
                "epoch() is one pass over one epoch; call epoch() again for the next one",
                stacklevel=2,
            )
        return self

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            self._ended = True
            raise

    def __bool__(self) -> bool:
        return True  # an iterator is always true; without this, bool() would ask __len__

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(
                "this epoch's number of batches is not known ahead: the daemon counts it only from "
                ".npy/.npz headers, and only when it can read them within a second"
            )
        return self._length

    def close(self) -> None:
        """Stop iterating (what leaving a ``for`` loop early does to a generator)."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


class NotADataset:
    """What a torch user tries first on a ``Client`` or ``Loader``, answered with what to do instead.

    ``torch.utils.data.DataLoader(client)`` takes it for a map-style Dataset and asks ``len()`` of it first
    (its sampler does); without this, that failed inside torch with "object of type 'Loader' has no len()".
    """

    def __bool__(self) -> bool:
        return True  # as without __len__: bool() would ask it

    def __len__(self) -> int:
        name = type(self).__name__
        raise TypeError(
            f"a {name} has no len(): len(x.epoch()) is an epoch's number of batches; a {name} is not a torch "
            f"Dataset (it gives batches already): for torch, use loader.torch.DataLoader(x) where the script "
            "has torch.utils.data.DataLoader"
        )


class Client(NotADataset):
    """Batches of one share of each epoch from a loader daemon. Context manager.

    ``dataset`` names which of the daemon's datasets to read (``"default"``: the config's
    ``[source]``/``[pipeline]``; others are its ``[datasets.NAME]`` tables). ``device``: ``"cpu"``
    numpy arrays, ``"torch"``/``"torch:cpu"`` CPU tensors, ``"cuda"``/``"cuda:N"``/a ``torch.device``
    GPU tensors (see ``loader.device``). ``prefetch``: messages read ahead of the training loop,
    1..32, or ``"auto"`` (the default, also as None): 4 in the first epoch, then as many as fit in
    128 MiB at the largest message seen, up to 16.
    """

    def __init__(
        self,
        address: str | os.PathLike[str] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        device: Any = "cpu",
        prefetch: int | str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        read_ahead: bool = True,
        channel: Channel | None = None,
        shm: bool = True,
        dataset: str = "default",
        progress_timeout_s: float = DEFAULT_PROGRESS_TIMEOUT_S,
        job: str = "default",
    ) -> None:
        # Left out: LOADER_ADDRESS, RANK, WORLD_SIZE (and LOCAL_RANK for a GPU without an index), as torchrun/Slurm set them.
        if isinstance(address, os.PathLike):
            address = os.fspath(address)  # a config file as a pathlib.Path
        if address is not None and not isinstance(address, str):
            # Client(5555) failed with "argument of type 'int' is not iterable".
            raise TypeError(
                f"a Client's address is tcp://HOST:PORT, HOST:PORT, ipc://PATH or a config file, not "
                f"{type(address).__name__} {address!r}"
            )
        rank, world_size = _whole_or_none("rank", rank), _whole_or_none("world_size", world_size)
        if not isinstance(dataset, str):
            raise TypeError(f"dataset must be a str (a dataset's name), got {type(dataset).__name__} {dataset!r}")
        if not isinstance(job, str):
            raise TypeError(f"job must be a str, got {type(job).__name__} {job!r}")
        address, rank, world_size, device = from_environment(address, rank, world_size, device)
        self._given_address = address  # a config file's name: "no daemon answered" says where its address is from
        if channel is None and not address.startswith(("tcp://", "ipc://", "inproc://")):
            # HOST:PORT or a config file, as `loader status` takes them; another scheme (http://) is refused
            # there by name, where zmq said only "Protocol not supported".
            address = daemon_address(address)
        if not 1 <= world_size <= P.MAX_WORLD_SIZE:
            raise ValueError(f"world_size must be in [1, {P.MAX_WORLD_SIZE}], got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.address, self.rank, self.world_size = address, rank, world_size
        self.dataset = dataset  # which of the daemon's datasets ([source] is "default", [datasets.NAME])
        self.job = job  # ranks of one training job read one stream (several jobs on one daemon: name them)
        self.prefetch = _prefetch(prefetch)  # what the first epoch reads ahead; later ones too unless auto
        self._auto_prefetch = prefetch is None or (isinstance(prefetch, str) and prefetch == "auto")
        self._largest_message = 0  # bytes of the biggest BATCH message's columns so far (receiver thread)
        self.timeout_s = _seconds("timeout_s", timeout_s)
        self.progress_timeout_s = _seconds("progress_timeout_s", progress_timeout_s)
        self.read_ahead = read_ahead
        self._placer = Placer(device)
        curve = peer_for(self._given_address) if channel is None else None
        # Keys from a config file: "no daemon answered" must not tell the user to set the environment's.
        self._keyed: bool | None = True if curve is not None else None  # None: LOADER_PEER_KEY says
        self._channel: Channel = (
            channel if channel is not None else transport.dealer(address, curve=curve, watched=True)
        )
        self._closed = False
        self._pid = os.getpid()  # a forked copy has the socket but not the receiver thread: _check_usable
        self._out: queue.Queue[tuple[str, int | None, Any]] = queue.Queue()
        self._commands: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._waker = transport.Waker()
        self._stop = threading.Event()
        self._consumed = 0  # batches the consumer took
        self._messages_taken = 0  # BATCH messages all of whose batches the consumer took: what credits count
        self._wait_s = 0.0  # the consumer's time blocked on the next batch (stats(), and each credit)
        self._waiting_since: float | None = None  # when the consumer's current wait began (None: not waiting)
        self._wait_lock = threading.Lock()  # the two above change together; the receiver reads them (_wait_total)
        self._received = [0, 0]  # batches, samples: written by the receiver thread only
        self._gens = itertools.count(1)
        self._gen = 0  # the request of the newest epoch() call: an older epoch's iterator is over
        self._loaded_gen = 0  # the request number load_state_dict took: older iterators were ended by it
        self._held: tuple[str, int | None, Any] | None = None  # an item of a newer request an old iterator met
        self._next_epoch = 0
        self._place = Place(0)  # where the training loop stands (state_dict); the consumer's thread moves it
        self._resume: Place | None = None  # load_state_dict's place, for the next epoch() call
        # Where the loop stood before each of the last batches it took (state_dict(held=...)): the consumer's too.
        self._before_taken: collections.deque[Place] = collections.deque(maxlen=MAX_HELD)
        self._fatal: BaseException | None = None
        try:
            self.info = self._handshake()
            # The daemon's monotonic clock less this process's (one host: the same clock, give or take the
            # welcome's way here, which makes the daemon's time read early; KEPT_MARGIN_S covers it). Each
            # pong reads it again (``_drain``).
            self._clock_offset = None if self.info.clock is None else self.info.clock - time.monotonic()
            _note_another_config(self._given_address, address, self.info.config)
        except BaseException:
            self._channel.close()
            self._waker.close()
            raise
        self.batch_format = self.info.batch_format
        # Owned by the receiver thread from here on (it maps, reads and closes the arenas).
        self._arenas = _arena_cache(self.info.shm) if shm else None
        self._row_files = RowFiles()  # files whose rows batches reference (receiver thread only)
        self._buffers = BatchBuffers()  # what big gathered batches are copied into, reused once dropped
        # At the daemon's pace, but never faster than any config allows: a welcome of ping_s 0 from a peer had the
        # receiver ping in a loop.
        self._ping_interval_s = max(MIN_HEARTBEAT_INTERVAL_S, min(PING_INTERVAL_S, float(self.info.ping_s)))
        # The thread holds the client weakly (``_receive``): a client dropped unclosed is collected, and this
        # finalizer stops its thread, which says goodbye to the daemon (its session would count forever).
        self._thread = threading.Thread(target=_receive, args=(weakref.ref(self),), name="loader-client", daemon=True)
        self._finalizer = weakref.finalize(self, _stop_receiver, self._stop, self._waker, self._thread)
        self._thread.start()
        _LIVE.add(self)

    _judge: ConnectJudge  # what the handshake's connection showed of the address (receiver thread, _handshake)

    # -- public -------------------------------------------------------------
    def epoch(self, epoch: int | None = None) -> EpochBatches:
        """Iterate the batches of the next epoch (or of ``epoch``); ends with ``StopIteration``.

        ``len()`` of it is the number of batches, where the daemon knows it (see ``EpochBatches``). The
        epoch is taken at its first batch: the daemon is asked for it then, and only then does the next
        ``epoch()`` move on to the epoch after it (or a loaded state's resume place get used up), so taking
        ``len()`` alone changes nothing. The iterator of the epoch before ends here.
        """
        self._check_usable()
        number = self._next_epoch if epoch is None else _epoch_number(epoch)
        resume = self._resume
        place = resume if resume is not None and resume.epoch == number else Place(number)
        gen = self._gen = next(self._gens)
        return EpochBatches(self._iterate(gen, number, place), self._length(place), number)

    def state_dict(self, held: int = 0) -> dict[str, Any]:
        """Where the training loop stands, as a small JSON-able dict to save with a checkpoint.

        Taken at the batches the loop has taken (not what was prefetched): after
        ``load_state_dict(state)`` the next ``epoch()`` continues with the batch that would
        have come next. It holds with another world size, worker count, transport or daemon.

        ``held``: a loop that takes batches ahead of the step it trains (Lightning, where ``len()`` is
        unknown, holds one) gives how many of the batches it took are not trained yet, and the state is
        taken before them, so a resume gives them again. At most ``MAX_HELD``, and no more than the
        batches taken of the epoch being iterated (or just ended).
        """
        if held:
            return self._held_back(held).state(self.dataset, self.world_size, self.info.fingerprint)
        place = self._resume or self._place
        return place.state(self.dataset, self.world_size, self.info.fingerprint)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s state: the next ``epoch()`` continues its epoch where it stood.

        A state of another dataset, or taken under another config (files, seed, batch size,
        shuffle, mappers...), raises ``ConfigError`` naming what differs. An epoch being iterated
        ends here (its next batch raises ``ClosedError``), as at a later ``epoch()``: it went on
        reading the old place while ``state_dict()`` said the loaded one, and a checkpoint taken
        then replayed its batches.
        """
        self._check_usable()
        place = place_of(state, self.dataset, self.info.fingerprint)
        self._resume, self._place, self._next_epoch = place, place, place.epoch
        self._before_taken.clear()
        self._gen = self._loaded_gen = next(self._gens)  # an open epoch's iterator is over

    def _held_back(self, held: int) -> Place:
        """Where the loop stood before the last ``held`` batches it took."""
        if isinstance(held, bool) or not isinstance(held, int) or not 0 <= held <= MAX_HELD:
            raise ValueError(f"held={held!r}: give the batches taken but not trained yet, 0 to {MAX_HELD}")
        if self._resume is not None or held > len(self._before_taken):
            taken = 0 if self._resume is not None else len(self._before_taken)
            raise ValueError(
                f"held={held}, but the loop took {taken} batch(es) of this epoch"
                + (" since a state was loaded" if self._resume is not None else "")
                + ": a state cannot be taken before batches this client did not give"
            )
        return self._before_taken[-held]

    def _length(self, place: Place) -> int | None:
        """Batches of an epoch started at ``place`` for this rank, where the daemon counted the samples."""
        if not place.position:
            return self.info.batches
        fingerprint = self.info.fingerprint or {}
        drop_last = bool(fingerprint.get("drop_last", False))
        return epoch_batches(self.info.samples, place.position, self.world_size, self.info.batch_size, drop_last)

    def reader(self) -> Callable[[], Iterator[Any]]:
        """A paddle batch reader: each call iterates the next epoch, as lists of sample tuples in field order."""
        return batch_reader(self.epoch)

    def close(self) -> None:
        """Say goodbye, stop the receiver thread (bounded wait) and close the socket. Idempotent."""
        self._close(THREAD_JOIN_TIMEOUT_S)

    def _close(self, join_s: float) -> None:
        """``close()``, waiting at most ``join_s`` for the receiver thread's goodbye."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        if self._pid != os.getpid():
            return  # a forked copy: the thread and the waker's other end are the parent's, left as they are
        self._stop.set()
        self._waker.wake()
        if self._thread is not threading.current_thread():
            self._thread.join(join_s)
        if not self._thread.is_alive():
            self._waker.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"{self.address!r}, rank={self.rank}, world_size={self.world_size}"
        if self.dataset != "default":
            where += f", dataset={self.dataset!r}"
        return f"<Client {where}{', closed' if self._closed else ''}>"

    def __iter__(self) -> Iterator[Any]:
        # A Loader iterates its epochs, so `for batch in client:` is tried too: it said only "not iterable".
        raise TypeError("a Client is iterated one epoch at a time: for batch in client.epoch(): ...")

    def stats(self) -> dict[str, Any]:
        """What this client has done: batches taken, batches and samples received, seconds waited for data."""
        return client_stats(self)

    @classmethod
    def from_env(cls, **overrides: Any) -> Client:
        """A client placed by the scheduler's variables (LOADER_ADDRESS, RANK, WORLD_SIZE, LOCAL_RANK);
        keyword arguments win over them (see ``loader.service.client.env``)."""
        return cls(**overrides)

    def _wait_total(self) -> float:
        """Seconds the training loop has waited for batches, the wait going on now included: a loop blocked
        for minutes shows it in the daemon's metrics while it lasts, not once its batch comes. Never less
        than an earlier answer (a counter)."""
        with self._wait_lock:
            since = self._waiting_since
            return self._wait_s + (time.perf_counter() - since if since is not None else 0.0)

    # -- consumer side ------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("the client is closed")
        if self._pid != os.getpid():
            # Without this check the forked copy's first batch waited for a receiver thread that was never
            # there and ended in "the client's receiver stopped", saying nothing of the fork.
            raise ClosedError(
                f"this Client was made in process {self._pid} and cannot be used in process {os.getpid()}, "
                "forked from it (its socket and receiver thread stay with the parent): make a Client in the "
                "process that reads (over a Client, torch's DataLoader takes num_workers=0: the daemon's "
                "workers do the reading)"
            )
        if self._fatal is not None:
            raise self._fatal

    def _iterate(self, gen: int, epoch: int, place: Place) -> Iterator[Any]:
        # The epoch is taken at its first batch, not at epoch(): one taken only for its len() is no request to
        # the daemon and moves the client nowhere. The ranks of a job pair their requests in order, so such a
        # request on one rank paired their epochs wrongly, and the job stalled (``ClientDesk._stream_for``);
        # and epoch() moving on at once made len(client.epoch()) skip an epoch, or drop a loaded resume place.
        self._check_current(gen, epoch)
        self._next_epoch, self._resume, self._place = epoch + 1, None, place
        self._before_taken.clear()
        self._commands.put(("epoch", place, gen))
        self._waker.wake()
        while True:
            self._check_current(gen, epoch)
            started = time.perf_counter()
            with self._wait_lock:
                self._waiting_since = started
            try:
                item = self._get(gen)
            finally:
                with self._wait_lock:
                    self._wait_s += time.perf_counter() - started
                    self._waiting_since = None
            kind, item_gen, payload = item
            if kind == "fatal":
                self._fatal = payload
                raise payload
            if item_gen is not None and item_gen > gen:
                self._held = item  # the newer epoch's, met by this one's iterator in another thread: kept
                continue
            if item_gen != gen:
                continue  # left over from an epoch the consumer abandoned
            if kind == "batch":
                staged, place, last_of_message = payload
                self._consumed += 1
                if last_of_message:
                    self._messages_taken += 1
                    self._waker.wake()
                self._before_taken.append(self._place)
                if place is not None:
                    self._place = place
                yield self._placer.finish(staged)
            elif kind == "end":
                self._place = Place(epoch + 1)
                return
            elif kind == "error":
                raise payload

    def _window_note(self) -> str:
        """Why a first batch may be slow to come: a shuffle window is read whole before any of its batches."""
        shuffle = int((self.info.fingerprint or {}).get("shuffle_buffer", 0) or 0)
        if shuffle <= 0:
            return ""
        window = window_rows(shuffle)
        return (
            f" (with shuffle_buffer = {shuffle}, an epoch's first batch waits for its first shuffle window, "
            f"{window} samples or the whole epoch if smaller, to be read)"
        )

    def _check_current(self, gen: int, epoch: int) -> None:
        if gen != self._gen and gen < self._loaded_gen:
            raise ClosedError(
                f"epoch {epoch}'s iterator was ended by load_state_dict(): the loaded state is read by the next "
                "epoch() (or iteration of a Loader), which continues where it stood"
            )
        if gen != self._gen:
            raise ClosedError(
                f"epoch {epoch}'s iterator was ended by a later epoch() call: a client reads one epoch at a "
                "time (use another Client for another stream)"
            )

    def _get(self, gen: int) -> tuple[str, int | None, Any]:
        """The receiver's next item; ``EpochStalledError`` after ``progress_timeout_s`` without one."""
        started = time.monotonic()
        deadline = started + self.progress_timeout_s
        noted = False
        while True:
            self._check_usable()
            held, self._held = self._held, None
            if held is not None:
                if held[1] == self._gen:
                    return held
                continue  # of a request that is itself superseded by now
            try:
                return self._out.get(timeout=RECEIVER_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._out.empty():
                    raise ServiceUnavailableError(f"the client's receiver for {self.address} stopped") from None
                now = time.monotonic()
                if not noted and now - started >= WAITING_NOTE_S and now < deadline:
                    noted = True
                    log.warning(
                        "no batch from the loader daemon at %s for %.0f s (request %d), though it answers; waiting "
                        "up to %g s in all: its log or `loader status` says what the epoch waits for%s",
                        self.address,
                        now - started,
                        gen,
                        self.progress_timeout_s,
                        self._window_note(),
                    )
                if now > deadline:
                    raise EpochStalledError(
                        f"the loader daemon at {self.address} is alive but sent nothing for this epoch "
                        f"(request {gen}) for {self.progress_timeout_s:g}s: see its log or `loader status`"
                    ) from None

    # -- receiver thread ----------------------------------------------------
    def _handshake(self) -> P.ClientWelcome:
        hello = P.ClientHello(
            rank=self.rank,
            world_size=self.world_size,
            prefetch=self.prefetch,
            dataset=self.dataset,
            job=self.job,
            owner=_process_owner(),
        )
        # Watched from the first connection on: an address where nothing listens is said to be one.
        channel = self._channel
        watch = channel.watch_peer(connecting=True) if isinstance(channel, transport.ZmqChannel) else None
        # What the connection shows of the address: nothing listens there (waited for all the same, since a daemon
        # started after its clients comes up there), or something broke off the handshake (which ends the wait).
        self._judge = ConnectJudge(watch, self.address, self._keyed, self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = request(
                self._channel,
                P.encode(hello),
                (P.ClientWelcome, P.Error),
                max(0.0, deadline - time.monotonic()),
                self.address,
                still_waiting=self._still_waiting,
                hopeless=self._judge.hopeless,
            )
            # Its rank is still held by a live client of the job (a restarted trainer's old process, not quiet
            # yet): asked again until that one is quiet, within timeout_s (the refusal says so, after it).
            if not (isinstance(answer, P.Error) and answer.refused == "rank"):
                break
            if time.monotonic() + RANK_RETRY_S >= deadline:
                break
            time.sleep(RANK_RETRY_S)
        if answer is None:
            said = self._judge.unanswered(time.monotonic() >= deadline)
            raise ServiceUnavailableError(
                f"no loader daemon answered at {self.address}{said}{address_origin(self._given_address)}"
            )
        if isinstance(answer, P.Error):
            error = {"version": ProtocolVersionError, "dataset": ConfigError}.get(answer.refused or "", LoaderError)
            raise error(f"the daemon at {self.address} refused the client: {answer.message}")
        assert isinstance(answer, P.ClientWelcome)
        mismatch = P.version_mismatch(answer, f"the daemon at {self.address}")
        if mismatch is not None:
            self._channel.try_send(P.encode(P.Bye()), timeout_s=0.0)  # it opened a session for us: end it now
            raise ProtocolVersionError(mismatch)
        if answer.batch_size > MAX_BATCH_SIZE:  # what bounds every batch's rows (``_parts``): no config has more
            self._channel.try_send(P.encode(P.Bye()), timeout_s=0.0)
            raise TransportError(
                f"the loader daemon at {self.address} sent a welcome of batch_size {answer.batch_size}, more than "
                f"any config allows ({MAX_BATCH_SIZE})"
            )
        return answer

    def _still_waiting(self, waited_s: float) -> None:
        """Said once while the handshake waits: a missing daemon is else silent for the whole timeout."""
        log.warning(
            "no answer yet from a loader daemon at %s after %.0f s; waiting up to %g s in all%s",
            self.address,
            waited_s,
            self.timeout_s,
            self._judge.reason(),
        )

    def _receive_once(self, state: _ReceiverState, poller: Any) -> None:
        """One round of the receiver thread: commands, credits, messages (up to ``RECEIVER_POLL_S``), pings."""
        self._waker.clear()
        self._run_commands(state)
        self._return_credits(state)
        for item in poller.wait(RECEIVER_POLL_S):
            if item is self._channel:
                self._drain(state)
        now = time.monotonic()
        if self._arenas is not None:
            self._arenas.evict_idle(now)
        self._row_files.evict_idle(now)
        if now - state.last_ping >= self._ping_interval_s:
            # Never wait for room: a daemon that reads nothing is found by the silence check
            # below, within timeout_s, not after a blocked ping's timeout on top of it.
            self._channel.try_send(P.encode(P.Ping(wait_s=round(self._wait_total(), 6))), timeout_s=0.0)
            state.last_ping = now
        if now - state.last_heard > self.timeout_s:
            raise ServiceUnavailableError(
                f"the loader daemon at {self.address} has been silent for {now - state.last_heard:.1f}s"
            )
        refused_s = state.peer.refused_for(now) if state.peer is not None else 0.0
        if refused_s > 0.0 and refused_s >= min(PEER_GONE_AFTER_S, self.timeout_s):
            raise ServiceUnavailableError(
                f"the loader daemon at {self.address} is gone: its connection closed and the address has refused "
                f"reconnecting for {refused_s:.1f}s (it stopped or was killed: see its log)"
            )

    def _run_commands(self, state: _ReceiverState) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            _, place, gen = command
            state.gen, state.over = gen, False
            state.credited = self._messages_taken
            state.allowed, state.received = self.epoch_prefetch(), 0
            request = P.Epoch(
                epoch=place.epoch,
                gen=gen,
                credit=state.allowed,
                ahead=self.read_ahead,
                shm=self._arenas is not None,
                position=place.position,
                anchor=list(place.anchor) if place.position else None,
                pack=P.MAX_PACK,
            )
            self._send(state, P.encode(request))

    def epoch_prefetch(self) -> int:
        """The messages the next epoch reads ahead: ``prefetch``, or with "auto" as many as fit in
        ``AUTO_PREFETCH_BYTES`` at the largest message seen, from ``DEFAULT_PREFETCH`` to ``AUTO_PREFETCH_MAX``."""
        if not self._auto_prefetch or self._largest_message <= 0:
            return self.prefetch
        return max(self.prefetch, min(AUTO_PREFETCH_MAX, AUTO_PREFETCH_BYTES // self._largest_message))

    def _return_credits(self, state: _ReceiverState) -> None:
        owed = self._messages_taken - state.credited
        if owed > 0 and state.gen is not None:
            state.credited += owed
            state.allowed += owed
            credit = P.Credit(n=owed, gen=state.gen, wait_s=round(self._wait_total(), 6))
            self._send(state, P.encode(credit))

    def _send(self, state: _ReceiverState, frames: list[Any]) -> None:
        """Send, waiting for room no longer than the daemon has left before it counts as silent."""
        left = state.last_heard + self.timeout_s - time.monotonic()
        if not self._channel.try_send(frames, timeout_s=max(0.0, left)):
            raise ServiceUnavailableError(
                f"the loader daemon at {self.address} has read nothing from this client "
                f"for {time.monotonic() - state.last_heard:.1f}s"
            )

    def _drain(self, state: _ReceiverState) -> None:
        """Take what has arrived, for ``RECEIVER_POLL_S`` at most: a daemon that sent without a pause (messages
        this client drops) kept the receiver here, so an epoch was never asked for and a closed client's
        receiver went on."""
        until = time.monotonic() + RECEIVER_POLL_S
        while state.last_heard < until:
            frames = self._channel.recv(0)
            if frames is None:
                return
            state.last_heard = time.monotonic()
            message, columns = self._decode(frames)
            if isinstance(message, P.Pong) and message.clock is not None and self._clock_offset is not None:
                # Each reading of the daemon's clock is at most its true offset (the answer took time to come);
                # the largest so far is the best: one welcome read late (this process stopped in its
                # handshake) would otherwise have made every batch's `kept` look further off than it is.
                self._clock_offset = max(self._clock_offset, message.clock - state.last_heard)
            if _of_no_open_request(message, state):
                continue  # the consumer would skip it: queued, a daemon sending such in a loop filled memory
            if isinstance(message, P.Batch):
                state.received += 1
                if state.received > state.allowed:  # what this client has room for is what it gave credit for
                    raise TransportError(
                        f"the loader daemon at {self.address} sent more batch messages than this client gave "
                        f"credit for ({state.allowed})"
                    )
                self._check_rows(message, columns)
                parts = self._parts(message)
                if message.refs:
                    try:
                        self._gather(message.refs, columns, message.files or {})
                        self._check_kept(message)
                    except (FileRowsError, RowsNotKeptError) as exc:
                        # A data file changed under its rows: that epoch fails, as with a worker's error, and
                        # the client stays usable (the rest of the epoch's batches are of an abandoned request).
                        state.over = True
                        self._out.put(("error", message.gen, exc))
                        continue
                self._largest_message = max(self._largest_message, block_nbytes(columns))
                self._received[0] += len(parts)
                self._received[1] += message.count
                start = 0
                for i, (count, place) in enumerate(parts):
                    rows = (
                        columns if len(parts) == 1 else {name: v[start : start + count] for name, v in columns.items()}
                    )
                    start += count
                    batch = to_batch(rows, message.sample_kind, self.batch_format)
                    self._out.put(("batch", message.gen, (self._placer.stage(batch), place, i == len(parts) - 1)))
            elif isinstance(message, P.End):
                state.over = True
                self._out.put(("end", message.gen, message))
            elif isinstance(message, P.Error):
                if message.unknown_session:
                    raise ServiceUnavailableError(f"the loader daemon at {self.address} no longer knows this client")
                state.over = True
                info = message.error or {"type": "LoaderError", "message": message.message}
                self._out.put(("error", message.gen, self._failure(info)))
            elif isinstance(message, P.Bye):
                raise ServiceUnavailableError(
                    f"the loader daemon at {self.address} ended this client ({message.reason})"
                )

    def _failure(self, info: dict[str, Any]) -> LoaderError:
        """The exception an ERROR describes: the daemon's own stall as ``EpochStalledError`` (what a training
        script catches for a stall, whichever side saw it first), anything else as ``WorkerError``."""
        error = WorkerError.from_dict(info)
        if error.type_name == "EpochStalledError" and error.worker is None and error.file is None:
            return EpochStalledError(f"the loader daemon at {self.address}: {error.message}")
        return error

    def _decode(self, frames: list[Any]) -> tuple[P.Message, dict[str, np.ndarray]]:
        """The daemon's message; one line naming the daemon when it does not decode."""
        try:
            return P.decode(frames)
        except MalformedMessageError as exc:
            raise TransportError(f"the loader daemon at {self.address} sent a malformed message: {exc}") from None

    def _check_rows(self, message: P.Batch, columns: dict[str, np.ndarray]) -> None:
        """A batch has rows, in columns (decoding checked that each holds ``count``): a batch of no columns
        reached the training loop as ``{}``."""
        if message.count < 1 or not columns:
            held = f"{len(columns)} column(s)" if columns else "no columns"
            raise TransportError(f"the loader daemon at {self.address} sent a batch of {message.count} rows in {held}")
        for name, values in columns.items():
            if values.dtype.names is not None:  # no stage sends one (it refuses them from workers)
                raise TransportError(
                    f"the loader daemon at {self.address} sent column {name[:64]!r} of a structured dtype "
                    f"({str(values.dtype)[:80]})"
                )

    def _check_kept(self, message: P.Batch) -> None:
        """Refuse a batch whose arena rows were copied after the daemon stopped keeping them for this client.

        Called once they are copied: until ``message.kept`` no other rows can be written where they lie, so a
        copy finished before it is whole. Later, this process was stopped or starved past
        ``service.reclaim_after_s`` (or past the heartbeat timeout, when the daemon dropped it), and the
        copy may hold other clients' rows."""
        if message.kept is None or self._clock_offset is None:
            return
        late = time.monotonic() + self._clock_offset - message.kept
        if late + KEPT_MARGIN_S > 0:
            when = f"{late:.1f}s after" if late > 0 else f"within {KEPT_MARGIN_S:g}s of when"
            raise RowsNotKeptError(
                f"a batch of epoch {message.epoch} from the loader daemon at {self.address} was copied {when} the "
                "daemon stopped keeping its shared-memory rows (service.reclaim_after_s after it was sent; was "
                "this process stopped, or starved of CPU?): they may hold other rows by now, so the batch is "
                "not given"
            )

    def _parts(self, message: P.Batch) -> list[tuple[int, Place | None]]:
        """(rows, place after it) of each batch a BATCH message holds: one, or its ``parts``; each of at most
        the welcome's ``batch_size`` rows (a daemon cuts no bigger one), checked before any row is gathered."""
        if message.parts is None:
            anchor = message.anchor
            place = Place(message.epoch, message.position, tuple(anchor)) if anchor is not None else None  # type: ignore[arg-type]
            parts = [(message.count, place)]
        else:
            parts = [(p[0], Place(message.epoch, p[1], tuple(p[2:])) if len(p) == 5 else None) for p in message.parts]  # type: ignore[arg-type]
            if sum(count for count, _ in parts) != message.count or any(count == 0 for count, _ in parts):
                raise TransportError(
                    f"the loader daemon at {self.address} sent a packed batch whose {len(parts)} parts do not add "
                    f"up to its {message.count} rows"
                )
        # A batch of 10**12 rows of zero bytes each decoded in no time, and batch_format = "list" then built
        # a sample per row without end.
        largest = max(count for count, _ in parts)
        if largest > self.info.batch_size:
            raise TransportError(
                f"the loader daemon at {self.address} sent a batch of {largest} rows, more than its batch_size of "
                f"{self.info.batch_size}"
            )
        return parts

    def _gather_into(self, nbytes: int) -> np.ndarray:
        """Memory for a gathered column: on a torch CUDA device, page-locked memory that goes to the device as it
        lies (one host copy of a batch instead of two; torch keeps and reuses it), else a reusable mapping."""
        pinned = self._placer.host_buffer(nbytes) if self._placer.gathers_pinned else None
        return self._buffers.empty(nbytes) if pinned is None else pinned

    def _gather(self, described: dict[str, Any], columns: dict[str, np.ndarray], files: dict[int, Any]) -> None:
        """Replace reference columns by fresh arrays copied out of the arenas and files (the daemon frees them)."""
        arenas = self._arenas
        if arenas is None:
            raise TransportError(f"the loader daemon at {self.address} sent references to a client without arenas")

        def source(ref_id: int) -> Any:
            if not is_file_id(ref_id):
                return arenas.get(ref_id)
            file = files.get(source_of(ref_id))
            if file is None:
                raise TransportError(f"the loader daemon at {self.address} sent a file row of no file")
            return self._row_files.open(file)

        for name, specs in described.items():
            refs = columns.get(name)
            # Integers, as the daemon asks of a worker: numpy took floats as references, and raised its own
            # OverflowError or TypeError for others, out of the receiver thread.
            if refs is None or refs.ndim != 2 or refs.shape[1] != 3 or refs.dtype.kind not in "iu":
                raise TransportError(f"reference column {name!r} from {self.address} is missing or malformed")
            refs = refs.astype(np.int64, copy=False)
            try:
                columns[name] = R.gather(refs, R.parse_specs(specs), source, free=False, empty=self._gather_into)
            except FileRowsError:
                raise  # a data file changed under its rows: that epoch fails, the client stays usable
            except ArenaError as exc:
                raise TransportError(f"the loader daemon at {self.address} sent a bad batch: {exc}") from None
            except (MemoryError, OSError) as exc:
                # Rows of the size the references claim (what a sparse file or arena holds, up to R.MAX_ROW_BYTES
                # a row) where this process has no such memory, or a read the system refused: numpy's or mmap's
                # own error left the receiver thread as it was.
                raise TransportError(
                    f"the loader daemon at {self.address} sent a batch this client cannot gather: {exc}"
                ) from None


def _of_no_open_request(message: P.Message, state: _ReceiverState) -> bool:
    """Whether ``message`` belongs to no request this client still reads: an abandoned epoch's (the daemon
    frees its rows), one of no request at all, or one after the END or ERROR that ended the current one.
    The consumer would skip each; ENDs and ERRORs take no credit, so only dropping them here bounds what is
    queued."""
    if not isinstance(message, (P.Batch, P.End, P.Error)) or (isinstance(message, P.Error) and message.unknown_session):
        return False
    return message.gen is None or message.gen != state.gen or state.over


def _whole_or_none(name: str, value: Any) -> int | None:
    """``value`` as an int (numpy's too), or None; a TypeError naming ``name`` for anything else (a str "0"
    failed later as "'<=' not supported between instances of 'int' and 'str'")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _prefetch(prefetch: Any) -> int:
    """``prefetch`` (None or "auto": the default to start with), refused at once when the daemon could
    not honour it."""
    if prefetch is None or (isinstance(prefetch, str) and prefetch == "auto"):
        return DEFAULT_PREFETCH
    if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or not 1 <= prefetch <= MAX_PREFETCH:
        raise ValueError(f'prefetch must be "auto" or an integer in [1, {MAX_PREFETCH}], got {prefetch!r}')
    return int(prefetch)


def _seconds(name: str, value: Any) -> float:
    """``value`` as a timeout, refused at once when it is not a finite number of seconds > 0."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return seconds


def _epoch_number(epoch: Any) -> int:
    """``epoch`` as an epoch number, refused at once (not by the daemon) when it is not one."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
        raise ValueError(f"epoch must be an integer in [0, 2**60), got {epoch!r} ({type(epoch).__name__})")
    if not 0 <= epoch < P.MAX_PLACE:
        raise ValueError(f"epoch must be an integer in [0, 2**60), got {epoch}")
    return int(epoch)


def _arena_cache(info: Any) -> ArenaCache | None:
    """A cache of the daemon's arenas when this process can map them (same host), else None."""
    if not isinstance(info, dict):
        return None
    try:
        cache = ArenaCache(info)
    except (KeyError, ValueError, TypeError):
        return None
    return cache if cache.probe() else None


def _receive(client_ref: weakref.ReferenceType[Client]) -> None:
    """The receiver thread: rounds of ``Client._receive_once`` while the client lives and is not closed.

    It holds the client only during a round, so a client nobody else holds is collected (its finalizer
    sets ``_stop``); what must be closed on the way out it holds itself."""
    client = client_ref()
    if client is None:
        return
    stop, out, waker, channel = client._stop, client._out, client._waker, client._channel
    closers = [c.close for c in (client._arenas, client._row_files, client._buffers) if c is not None]
    state = _ReceiverState(time.monotonic())
    poller = transport.Poller()
    poller.register(channel)
    poller.register(waker)
    if isinstance(channel, transport.ZmqChannel):
        state.peer = channel.watch_peer()  # made here: this thread uses the socket from now on
    del client
    try:
        while not stop.is_set():
            client = client_ref()
            if client is None:
                break
            client._receive_once(state, poller)
            del client
    except BaseException as exc:  # whatever stops the receiver reaches the consumer
        out.put(("fatal", None, exc))
    finally:
        try:
            said_bye = channel.try_send(P.encode(P.Bye()), timeout_s=0.0)
            if said_bye and state.gen is not None and not state.over and state.received < state.allowed:
                _drop_in_flight(channel)  # batches it gave credit for may still be on their way
        except Exception:  # best effort on the way out
            pass
        channel.close()
        for close in closers:
            close()
        if client_ref() is None:
            waker.close()  # nobody can wake it any more (``close()`` closes it otherwise)


def _drop_in_flight(channel: Any) -> None:
    """Receive and drop what arrives until none has for ``CLOSE_QUIET_S`` (``CLOSE_DRAIN_S`` at most)."""
    deadline = time.monotonic() + CLOSE_DRAIN_S
    while (left := deadline - time.monotonic()) > 0:
        if channel.recv(min(CLOSE_QUIET_S, left)) is None:
            return


_OWNERS: dict[int, str] = {}


def _process_owner() -> str:
    """This process's random value (``ClientHello.owner``): made anew in a forked child, which is another
    process to the daemon."""
    pid = os.getpid()
    owner = _OWNERS.get(pid)
    if owner is None:
        owner = _OWNERS[pid] = secrets.token_hex(16)
    return owner


# Clients not closed yet. At interpreter exit the receiver threads (daemon threads) die before they say BYE,
# and the daemon would keep each session until its silence timeout: close() them first, which waits (bounded)
# for the goodbye. Only at exit: a join in the finalizer would run wherever garbage collection happens to.
_LIVE: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_live_clients() -> None:
    # A forked child's copies are not its own: their sockets and threads belong to the parent.
    clients = [client for client in _LIVE if client._pid == os.getpid()]
    # Every receiver told to stop first, then one deadline for them all: each close() waiting its own
    # THREAD_JOIN_TIMEOUT_S added that much per client to the exit of a process whose daemon had died
    # (each receiver stuck in a send waiting for room).
    for client in clients:
        client._stop.set()
        client._waker.wake()
    deadline = time.monotonic() + THREAD_JOIN_TIMEOUT_S
    for client in clients:
        try:
            client._close(max(0.0, deadline - time.monotonic()))
        except Exception:  # best effort on the way out
            pass


def _stop_receiver(stop: threading.Event, waker: Any, thread: threading.Thread) -> None:
    """A client was collected unclosed: stop its receiver thread (which closes the rest), or, when that thread
    had ended already (a fatal error), close what it left to the client."""
    stop.set()
    waker.wake()
    if not thread.is_alive():
        waker.close()


def _note_another_config(given: str | None, address: str, serving: str | None) -> None:
    """A WARNING when this client was given a config file and the daemon at its address serves another one:
    two projects' daemons both on the default port, and a script read the other's data without a word."""
    other = another_config(given, serving)
    if other is not None:
        log.warning(
            "the daemon at %s serves %s, not %s: another config's daemon listens at its address", address, other, given
        )


class _ReceiverState:
    def __init__(self, now: float) -> None:
        self.last_heard = now
        self.last_ping = now
        self.gen: int | None = None
        self.credited = 0
        self.allowed = 0  # BATCH messages of request ``gen`` the daemon may send: its credit so far
        self.received = 0  # ... and those it sent
        self.over = False  # the END or ERROR of request ``gen`` arrived: nothing more of it is taken
        self.peer: transport.PeerWatch | None = None  # whether the daemon's address still listens


__all__ = ["Client", "EpochBatches", "EpochStalledError", "query_status"]
