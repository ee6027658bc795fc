"""The daemon: one loop over two message sources, handing each message to its handler.

Sources: the well-known endpoint ``config.service.bind`` (a ROUTER: worker
control, clients, ``loader status``) and the data endpoint (worker chunks, file
results; ordered per worker, so a file's end marker follows its data). With
the "pipe" and "queue" transports the daemon's own workers use a pipe link each
(``transport.links``), joined to the same two sources, so this loop is the same
for every transport. Worker messages go to ``WorkerPool`` (``workforce``),
client messages to ``ClientDesk`` (``desk``), data to the ``Stage``. No locks:
one thread runs it all. The coordinator never sees sample bytes; per data
message it only notes that the sending worker made progress.

Every peer is treated as hostile (``docs/security.md``): a message is acted on
only once it decoded, and a data message only when its sender holds the
lease it names (``Coordinator.owns``: lease id, token, stream, file, worker)
and its shared-memory references lie in that worker's own arena
(``RefKeeper.check_owned``). Whatever a handler raises because of a message is
caught, counted in ``status()["rejected_messages"]`` and logged at most once
per peer per minute (``rejects``): nothing a peer sends stops the daemon. With
``service.daemon_key`` the sockets are CURVE servers admitting only the listed
keys, plus a key pair made for the daemon's own workers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from loader.config import LoaderConfig
from loader.config.sections import ServiceConfig
from loader.errors import ConfigError, MalformedMessageError, ServiceUnavailableError, TransportError, WorkerError
from loader.runtime.limits import raise_open_files_limit
from loader.runtime.processes import cpu_count
from loader.service import protocol as P
from loader.service import transport
from loader.service.daemon.autoscale import Autoscaler
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.datasets import DatasetTable
from loader.service.daemon.desk import ClientDesk
from loader.service.daemon.launcher import DEFAULT_WORKER_ENTRY, make_launcher
from loader.service.daemon.metrics import MetricsServer, require_prometheus_client, start_metrics
from loader.service.daemon.rate import RecentRate
from loader.service.daemon.rejects import LOG_EVERY_S, Rejects
from loader.service.daemon.stage import SHOWN_RANKS, Stage, frames_nbytes
from loader.service.daemon.streams import Session
from loader.service.daemon.workforce import HUNG_FILE_ATTEMPTS, MAX_FILE_ATTEMPTS, WorkerPool
from loader.service.shm.file_layout import FileChangedError
from loader.service.shm.pool import open_pool
from loader.service.shm.room import ShmRoom
from loader.service.transport import auth, links, sockets

log = logging.getLogger("loader.daemon")

POLL_INTERVAL_S = 0.05
HOUSEKEEPING_INTERVAL_S = 0.1
MAX_DRAIN_MESSAGES = 64  # per socket per loop turn, so one busy socket cannot starve the other
# ... and control messages stop for the turn once they took this long: a message may cost the loop O(files) (an
# EPOCH makes a stream of every lease), and 64 of them from one client held worker data unread for seconds, so
# honest workers were stopped as hung and their clients' epochs failed.
CONTROL_DRAIN_BUDGET_S = 0.05
WORKER_JOIN_TIMEOUT_S = 2.0
MANY_WORKERS_PER_CORE = 2  # the daemon's own workers beyond this many a core: a warning at start
# Largest control message the daemon takes (hellos, epochs, credits are tiny; nothing there carries columns).
MAX_CONTROL_MESSAGE_BYTES = 1024 * 1024
# Largest header (frame 0) of a data message: a chunk's fields and column descriptions take a few KiB. A header
# is unpacked before anything else is checked, and 64 MiB of small msgpack integers cost 0.6 GiB to unpack.
MAX_DATA_HEAD_BYTES = 1024 * 1024
# Who a refused data message is logged as when its sender is unproven (no lease token it holds): the data endpoint
# cannot tell senders apart, so the worker name in such a message is a claim, not a peer to rate-limit by.
FORGED_DATA_PEER = "the data endpoint (a sender holding no lease)"


def _source(config: Any, key: str) -> str:
    """Where ``key`` (``"service.bind"``) came from: the file, a variable, ``--bind`` or ``--set`` (a default:
    the file)."""
    source = config.sources.get(key, "default")
    return config.origin if source == "default" else source


# The [service] keys whose failures at start-up name where their value came from (``_sources``).
_NAMED_KEYS = ("service.bind", "service.data_port", "service.daemon_key", "service.authorized_keys", "service.metrics")


def _sources(config: Any) -> dict[str, str]:
    return {key: _source(config, key) for key in _NAMED_KEYS}


def check_service(config: Any) -> None:
    """What the daemon refuses of ``config.service`` at start (for ``loader check``): a bind beyond loopback
    without authentication (unless ``insecure``), key files it cannot read, and metrics without their package."""
    service = config.service
    if service.authenticated:
        _server_keys(service, _sources(config))
    else:
        _refuse_unauthenticated(service, _sources(config))
    if service.metrics:
        try:
            require_prometheus_client()
        except ConfigError as exc:
            raise ConfigError(f"{exc} ({_source(config, 'service.metrics')})") from None


def _server_keys(service: ServiceConfig, sources: Mapping[str, str]) -> auth.CurveServer:
    """The daemon's CURVE keys; a key file it cannot read is a ``ConfigError`` naming the key and its file."""
    assert service.daemon_key is not None and service.authorized_keys is not None
    try:
        return auth.server_keys(service.daemon_key, service.authorized_keys)
    except ConfigError as exc:  # "service.daemon_key: ..." or "service.authorized_keys: ..."
        key = str(exc).partition(":")[0]
        raise ConfigError(f"{exc} ({sources.get(key, service.origin)})") from None


def _refuse_unauthenticated(service: ServiceConfig, sources: Mapping[str, str]) -> None:
    if not service.is_loopback and not service.insecure:
        raise ConfigError(
            f"service.bind {service.bind!r} reaches beyond this host and the daemon has no authentication: "
            f"set service.daemon_key and service.authorized_keys (`loader keys`), or service.insecure = true "
            f"to let anyone who reaches the port read the data ({sources.get('service.bind', service.origin)})"
        )


def _warn_of_many_workers(config: LoaderConfig) -> None:
    """Say so when the daemon's own workers are well over the cores (as torch's DataLoader warns of its
    num_workers): they share them, each with its memory and start-up, and read no faster."""
    if config.workers.launcher != "local":
        return  # started elsewhere (Ray): this machine's cores say nothing of theirs
    count, cores = max(config.workers.count, config.workers.max), cpu_count()
    if count > MANY_WORKERS_PER_CORE * cores:
        log.warning(
            "workers.%s = %d is over %d times the %d core(s) this process may use: the workers share them, "
            "each taking memory and start-up time, and read no faster than about one a core (%s)",
            "max" if config.workers.max > config.workers.count else "count",
            count,
            MANY_WORKERS_PER_CORE,
            cores,
            config.origin,
        )


def _authentication(
    service: ServiceConfig, sources: Mapping[str, str] | None = None
) -> tuple[sockets.AuthServer | None, auth.CurveClient | None]:
    """(the CURVE server, the keys of the daemon's own workers), or (None, None) without ``daemon_key``.

    A daemon bound beyond loopback refuses to start unauthenticated unless ``service.insecure`` says so.
    """
    sources = sources or {}
    if not service.authenticated:
        _refuse_unauthenticated(service, sources)
        if not service.is_loopback:
            log.warning(
                "service.insecure = true: %s has no authentication; anyone who reaches the port can read the data, "
                "read the config and join as a worker (%s)",
                service.bind,
                service.origin,
            )
        return None, None
    keys = _server_keys(service, sources)
    own_public, own_secret = sockets.curve_keypair()  # the daemon's own workers: a pair made for them alone
    server = sockets.AuthServer(keys.admitting(own_public))
    return server, auth.CurveClient(keys.public, own_public, own_secret)


def _open_sources(
    transport_kind: str, service: ServiceConfig, server: Any, sources: Mapping[str, str] | None = None
) -> tuple[Any, Any, Any]:
    """(router, data source, worker links or None) for ``config.workers.transport``; a socket that cannot
    bind is a ``TransportError`` naming the key that chose its address and where that came from."""
    sources = sources or {}

    def where(key: str) -> str:
        return f"{key} from {sources.get(key, service.origin)}"

    try:
        router = transport.Router(service.bind, server=server, max_message_bytes=MAX_CONTROL_MESSAGE_BYTES)
    except TransportError as exc:  # a port in use is a config problem: say where the value came from
        raise TransportError(f"{exc} ({where('service.bind')})") from exc
    try:
        if transport_kind in links.MP_TRANSPORTS:
            worker_links = links.WorkerLinks(transport_kind)
            return links.SplitRouter(router, worker_links.control), worker_links.data, worker_links
        try:
            data = transport.pull(
                transport.data_endpoint_for(router.endpoint, service.data_port),
                server=server,
                max_message_bytes=service.max_message_mib * 1024 * 1024,
            )
        except TransportError as exc:  # a fixed data port in use is that key's problem, not service.bind's
            key = "service.data_port" if service.data_port else "service.bind"
            raise TransportError(f"{exc} ({where(key)})") from exc
        return router, data, None
    except BaseException:
        router.close()
        raise


class Daemon:
    """Coordinator, stage and workers behind one control endpoint. Context manager."""

    def __init__(
        self, config: LoaderConfig, *, worker_entry: str = DEFAULT_WORKER_ENTRY, start_workers: bool = True
    ) -> None:
        """Serve ``config``; ``worker_entry`` names the worker function (tests swap in faulty ones), and
        ``start_workers=False`` waits for hand-started workers only."""
        self.config = config
        pipeline, workers = config.pipeline, config.workers
        self.datasets = DatasetTable(config)  # every dataset's files; ConfigError for no match / empty list
        self.files = self.datasets.files
        seed = self.datasets.default.seed
        self._closed = False
        self.rejects = Rejects()  # messages dropped: malformed, not the sender's, or that made a handler raise
        self.late_data = 0  # data messages of leases that ended meanwhile, dropped (not an attack)
        self.bytes_received = 0  # of data messages from workers
        origin = config.origin
        self._config_path = os.path.abspath(origin) if os.path.isfile(origin) else origin
        self.metrics: MetricsServer | None = None  # the operators' HTTP endpoint (service.metrics), started last
        self._metrics_failed = False
        # First: a launcher that needs a missing package (Ray) fails before anything is bound.
        launcher = make_launcher(config)
        _warn_of_many_workers(config)
        raise_open_files_limit()  # a socket per peer connection: the default soft limit is small
        sources = _sources(config)
        self._auth, own_keys = _authentication(config.service, sources)
        try:
            # Bind first: a daemon that cannot bind (port in use) touches nothing in /dev/shm.
            self._router, self._data, worker_links = _open_sources(
                workers.transport, config.service, self._auth, sources
            )
        except BaseException:
            if self._auth is not None:
                self._auth.close()
            raise
        try:
            self.arenas = open_pool(workers.shm_arena_mib * 1024 * 1024)
        except BaseException:
            self._router.close()
            self._data.close()
            if self._auth is not None:
                self._auth.close()
            raise
        # Big rows arriving inline while /dev/shm is full (a container's 64 MiB): said once (shm/room.py).
        self._shm_room = (
            # The most local workers (each has an arena): workers.max when it scales them.
            ShmRoom(self.arenas.directory, workers.shm_arena_mib, max(workers.count, workers.max))
            if self.arenas is not None
            else None
        )
        self.endpoint = self._router.endpoint
        self.data_endpoint = self._data.endpoint
        # The second port to open in a firewall (service.data_port fixes it; workers learn it in their welcome).
        log.info("workers send data to %s", self.data_endpoint)
        self._poller = transport.Poller()
        self._poller.register(self._router)
        self._poller.register(self._data)
        self.stage = Stage(
            batch_size=pipeline.batch_size,
            drop_last=pipeline.drop_last,
            shuffle_buffer=pipeline.shuffle_buffer,
            seed=seed,
            samples_per_message=workers.samples_per_message,
            send=lambda peer, frames: self.clients.send(peer, frames),
            arenas=self.arenas,
            on_error=pipeline.on_error,
            batch_format=pipeline.batch_format,
            files=self.files,
            # Past the progress timeouts of a file's hung workers: a file that hangs fails naming that cause.
            stall_timeout_s=(HUNG_FILE_ATTEMPTS + 1) * workers.progress_timeout_s,
            reorder_bytes=config.service.reorder_window_mib * 1024 * 1024,
            stream_buffer_bytes=config.service.stream_buffer_mib * 1024 * 1024,
            lease_note=self.datasets.lease_note,
            file_record=self.datasets.file_record,
        )
        self.stage.refs.allow_files = workers.file_rows
        self.stage.refs.keep_s = config.service.reclaim_after_s
        self.coordinator = Coordinator(
            self.files,
            heartbeat_timeout_s=float(workers.heartbeat_timeout_s),
            may_lease=self.stage.may_lease,
            lease_start=self.stage.lease_start,
            progress_timeout_s=workers.progress_timeout_s,
            leases_ahead=workers.leases_ahead,
            pin_files=workers.file_rows and self.arenas is not None,  # a worker may send file rows
        )
        self.pool = WorkerPool(
            self.coordinator,
            send=self._router.send,
            config=config.to_dict(),
            data_endpoint=self.data_endpoint,
            endpoint=self.endpoint,
            entry=worker_entry,
            links=worker_links,
            on_file_failed=self.stage.fail_file,
            arenas=self.arenas,
            lease_fields=lambda file_index: self.datasets.owner(file_index).lease_fields(file_index),
            lease_note=self.datasets.lease_note,
            next_record=self._next_file_record,
            file_record=self.datasets.file_record,
            max_workers=config.service.max_workers,
            max_arenas=2 * (config.service.max_workers + workers.count),
            own_keys=own_keys,
            on_start_failed=self.stage.fail_waiting,
            launcher=launcher,
        )
        self.clients = ClientDesk(
            config,
            router=self._router,
            stage=self.stage,
            coordinator=self.coordinator,
            pool=self.pool,
            arenas=self.arenas,
            datasets=self.datasets,
        )
        self._started_at = time.monotonic()
        self._rate = RecentRate()
        self._next_housekeeping = 0.0
        # Autoscaling acts on our own workers when workers.max says so; else it only advises (the metric).
        self.autoscaler = Autoscaler(self, workers.min, workers.max, act=bool(workers.max) and start_workers)
        self._data_accepting = True  # the data source is polled (Stage.accepting)
        self._pump_logged_at = -LOG_EVERY_S  # when a batch that could not be sent was last logged (``_pump``)
        try:
            if config.service.metrics:
                try:
                    self.metrics = start_metrics(config.service.metrics)
                except ConfigError as exc:  # a port in use: name the file (or flag) the address came from
                    raise ConfigError(f"{exc} ({sources['service.metrics']})") from None
            for _ in range(workers.count if start_workers else 0):
                self.pool.launch()
        except BaseException:
            self.close()
            raise

    # -- lifecycle ----------------------------------------------------------
    def serve(self, stop_event: threading.Event | None = None) -> None:
        """Run until ``stop_event`` is set (forever without one)."""
        stop_event = stop_event or threading.Event()
        self.pool.stop_requested = stop_event  # workers that leave once it is set are not replaced (``WorkerPool``)
        try:
            while not stop_event.is_set() and not self._closed:
                self.step(POLL_INTERVAL_S)
        except Exception as exc:
            if self._closed:
                return  # closed from another thread mid-turn (a Loader whose join timed out): not a fault
            # A fault of the daemon itself (a peer's message or a file fails only its sender or its file): every
            # client is told why at once and the workers stop, instead of the clients waiting out their timeout
            # on a loop that is gone (in a Loader the thread just ended, with a traceback on stderr).
            reason = f"the daemon failed: {type(exc).__name__}: {exc}"
            log.error("%s; stopping (the traceback is logged at DEBUG)", reason)
            log.debug("the daemon's loop failed", exc_info=True)
            self.close(reason)
            raise ServiceUnavailableError(reason) from exc

    def close(self, reason: str = "daemon stopping") -> None:
        """Say BYE (with ``reason``) to clients, stop our worker processes, close sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            bye = P.encode(P.Bye(reason=reason))
            for session in list(self.stage.sessions.values()):
                self._router.send(session.peer, bye)
            self.pool.close(WORKER_JOIN_TIMEOUT_S)
            if self.metrics is not None:
                self.metrics.close()
            self._router.close()
            self._data.close()
            if self._auth is not None:
                self._auth.close()  # after the sockets: terminating its context waits for them
            self.stage.refs.files.close()
        finally:
            # After the workers, but also when stopping them was interrupted (a second Ctrl-C in a Loader's
            # script): nothing in /dev/shm outlives the daemon.
            if self.arenas is not None:
                self.arenas.close()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------
    def step(self, timeout_s: float) -> None:
        """One turn: read what is ready, move batches, lease files, check liveness."""
        self._pace_data()
        now = time.monotonic()
        # A lease queued behind a slow file, and an EPOCH that waited for its client's pace, are acted on in time.
        ready = self._poller.wait(
            min(timeout_s, self.coordinator.take_back_due_in(now), max(0.0, self.clients.parked_due_in(now)))
        )
        if self._data in ready:
            for _ in range(MAX_DRAIN_MESSAGES):
                if not self.stage.accepting():
                    break  # full: the rest waits in the workers (Stage.accepting)
                frames = self._data.recv(0)
                if frames is None:
                    break
                self._on_data(frames)
        if self._router in ready:
            budget_ends = time.monotonic() + CONTROL_DRAIN_BUDGET_S
            for _ in range(MAX_DRAIN_MESSAGES):
                got = self._router.recv(0)
                if got is None:
                    break
                self._on_control(*got)
                if time.monotonic() >= budget_ends:
                    break  # the rest waits a turn (zmq queues it fairly per peer): worker data goes first
        for peer, why in self.clients.start_parked_epochs():
            self.rejects.reject(who_of(peer), why)
        self.clients.handle_events()
        for session in list(self.stage.sessions.values()):
            self._pump(session)
        self.pool.dispatch()
        self.clients.read_ahead_when_leased()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_INTERVAL_S
            self._rate.record(now, self.stage.samples_in)
            self.pool.reap()
            self.clients.reap(now)
            self.stage.refs.reclaim(self.stage.sessions.values(), now)
            self.stage.collect_specs()
            # Files the stage read rows of itself (a client on another host, a padded repeat): closed once
            # unused, as a client closes its own, so a deleted or replaced data file's space is not held.
            self.stage.refs.files.readers.evict_idle(now)
            if self.arenas is not None and self.arenas.has_retired:
                for arena_id in self.arenas.collect(self.stage.arenas_held(), now):
                    self.stage.refs.forget_arena(arena_id)
            self.autoscaler.tick(now)
            if self.metrics is not None and self.metrics.due(now):
                try:
                    self.metrics.publish(self.metrics.snapshotter.take(self, now))
                except Exception:  # operators lose a scrape, never the daemon
                    if not self._metrics_failed:  # once: the same failure would recur at every snapshot
                        log.exception("taking the metrics snapshot failed; serving goes on")
                    self._metrics_failed = True

    def _pump(self, session: Session) -> None:
        """Send a client what its credits allow; a batch that cannot be sent fails its epoch, not the daemon.

        The stage checks every chunk before its rows join a stream (``Stage.chunk_problem``, ``fit``), so
        this guard is for what no check foresaw: batches are made of rows a worker sent, and should one
        still fail to encode, the loop would otherwise raise out of ``serve`` and stop serving everyone.
        The batch's rows were taken from the stream (freed, or outstanding for the session) before it
        failed, and the failed stream is dropped whole by ``handle_events``, so nothing is left half-done.
        """
        try:
            self.stage.pump(session)
        except Exception as exc:
            stream = session.current
            now = time.monotonic()
            if now - self._pump_logged_at >= LOG_EVERY_S:  # once a minute: each epoch of bad rows would recur
                self._pump_logged_at = now
                log.exception("a batch for client session %d could not be sent; its epoch fails", session.session_id)
            if stream is not None:
                message = f"a batch of epoch {stream.epoch} could not be sent: {type(exc).__name__}: {exc}"
                self.stage.fail_stream(stream, WorkerError("BatchError", message).to_dict())

    @property
    def rejected_messages(self) -> int:
        """Messages dropped because of what a peer sent (``status()["rejected_messages"]``)."""
        return self.rejects.count

    def _pace_data(self) -> None:
        """Stop reading worker data while the stage is full (``Stage.accepting``): workers then wait
        for room mid-file. Their progress clocks are held meanwhile: waiting is not hanging."""
        accepting = self.stage.accepting()
        if accepting != self._data_accepting:
            self._data_accepting = accepting
            (self._poller.register if accepting else self._poller.unregister)(self._data)
        if not accepting:
            for record in self.coordinator.workers.values():
                if record.leases:
                    self.coordinator.progressed(record.worker_id)

    def _on_data(self, frames: list[Any]) -> None:
        nbytes = frames_nbytes(frames)
        self.bytes_received += nbytes
        if frames and frames_nbytes(frames[:1]) > MAX_DATA_HEAD_BYTES:
            self.rejects.reject("the data endpoint", f"a message header over {MAX_DATA_HEAD_BYTES} bytes")
            return
        try:
            message, head = P.decode_head(frames)
        except MalformedMessageError as exc:  # the data endpoint cannot name its sender
            self.rejects.reject("the data endpoint", f"malformed: {exc}")
            return
        if not isinstance(message, P.FileMessage):
            self.rejects.reject("the data endpoint", f"a {message.KIND} message has no business there")
            return
        who = f"data from worker {message.worker[:64]!r}"
        # Before its columns are decoded: anyone may send to this endpoint, and an object column costs many
        # times its bytes to decode (``P.decode_head``).
        if not self.coordinator.owns(message.worker, message.lease, message.token, message.stream, message.file):
            if self.coordinator.was_owned(message.worker, message.lease, message.token):
                self.late_data += 1  # its lease ended meanwhile (cancelled, re-leased, finished): routine
                return
            # Logged under the endpoint, not the name: an unproven name is the sender's to choose, and a fresh
            # one per message got a log line each.
            self.rejects.reject(
                FORGED_DATA_PEER,
                f"{who} claims lease {message.lease} (stream {message.stream}, file {message.file}), "
                "which that worker does not hold",
            )
            return
        try:
            columns = P.decode_columns(message, head, frames)
        except MalformedMessageError as exc:
            self.rejects.reject(who, f"malformed: {exc}")
            return
        stream = self.stage.streams.get(message.stream)
        if stream is not None:  # bytes per dataset: only what a lease of its streams brought
            self.stage.traffic_of(stream.dataset).bytes_in += nbytes
        try:
            refused = self._on_file_message(message, columns)
        except Exception as exc:  # whatever a peer's message makes a handler raise
            self.rejects.reject(who, f"{message.KIND} failed: {type(exc).__name__}: {exc}")
            return
        if refused is not None:
            self.rejects.reject(
                who, f"a chunk of file {message.file} (stream {message.stream}) is malformed: {refused}"
            )

    def _next_file_record(self, stream_id: int, file_index: int) -> int | None:
        """The first record of a lease the stream lacks, numbered in its file (a piece's begin past 0), for
        the errors of the workers it loses."""
        record = self.stage.next_record(stream_id, file_index)
        return None if record is None else self.datasets.file_record(file_index, record)

    def _past_piece(self, chunk: P.Chunk, columns: P.Columns) -> str | None:
        """Why a chunk of a lease of a piece names records past the piece's end (None when it does not). Those
        are the next pieces' records (file rows of them pass ``bind_file_rows``, which sees only the file): taken
        here, they would come twice, and a re-lease would start past the piece."""
        piece = self.datasets.owner(chunk.file).piece(chunk.file)
        if piece is None:
            return None
        index = columns.get(P.INDEX_COLUMN)  # ``chunk_problem`` checked it rises from ``chunk.record``
        last = chunk.record + chunk.count - 1 if index is None else int(index.max())
        if last < piece[1]:
            return None
        return (
            f"it names record {last} of a lease of {piece[1]} records (a piece of its file: source.records_per_lease)"
        )

    def _on_file_message(self, message: P.FileMessage, columns: P.Columns) -> str | None:
        """Hand a data message to the stage; why a chunk was refused, or None."""
        if isinstance(message, P.Chunk):
            # Before its references are marked held: a refused chunk must leave no trace.
            refused = self.stage.chunk_problem(message, columns)
            if refused is not None:
                return refused
            refused = self._past_piece(message, columns)
            if refused is not None:
                return refused
            job = self.coordinator.leased_job(message.worker, message.lease)  # file rows name this file only
            path, seen = (job.path, job.file_identities) if job is not None else (None, None)
            first = self.datasets.file_record(message.file, 0)  # a piece's rows begin past record 0 of its file
            arena = self.pool.arena_of(message.worker)
            try:
                self.stage.refs.check_owned(message.refs, columns, arena, message, path, seen, first)
            except FileChangedError as exc:  # only that: a peer's bad reference (an unknown member) is refused
                self._file_changed(message, path, exc)
                return None
        # The coordinator only notes the time: a worker that sends (acceptable) data is not hung.
        self.coordinator.progressed(message.worker, message.lease)
        if isinstance(message, P.Chunk):
            if self._shm_room is not None:
                self._shm_room.note_chunk(message.refs, columns)
            self.stage.on_chunk(message, columns)
        elif isinstance(message, P.FileDone):
            self.stage.on_done(message)
        elif isinstance(message, P.FileError):
            self.stage.on_file_error(message)
        return None

    def _file_changed(self, chunk: P.Chunk, path: str | None, exc: FileChangedError) -> None:
        """The leased file changed under its lease (the daemon's own stat says so), seen in rows of the worker
        holding it. Dropping the chunk as a bad one left the epoch to fail at the lease's FILE_DONE as
        LostDataError, "a chunk was lost on the way", with the cause only in the daemon's log. Under ``raise``
        the file fails now, named, at the chunk's first record; under ``skip`` its FILE_DONE skips the rest and
        counts it (the worker's count of what it sent), saying why."""
        stream = self.stage.streams.get(chunk.stream)
        if stream is None:
            return
        if self.stage.on_error == "skip":
            stream.changed[chunk.file] = str(exc)
            return
        record = self.stage.file_record(chunk.file, chunk.record)
        error = WorkerError("FileChangedError", str(exc), worker=chunk.worker, file=path, record=record)
        self.stage.fail_file(chunk.stream, chunk.file, error.to_dict(), lost=chunk.count)

    def _on_control(self, peer: bytes, frames: list[Any]) -> None:
        who = who_of(peer)
        try:
            message, head = P.decode_head(frames)
            if message.HAS_COLUMNS:  # data: never sent here, so its columns (costly) are not decoded
                raise MalformedMessageError(f"a {message.KIND} message has no business on the control endpoint")
            P.decode_columns(message, head, frames)  # none: refuses extra frames
        except MalformedMessageError as exc:
            self.rejects.reject(who, f"malformed: {exc}")
            return
        try:
            self._on_control_message(peer, message)
        except Exception as exc:  # whatever a peer's message makes a handler raise
            self.rejects.reject(who, f"{message.KIND} failed: {type(exc).__name__}: {exc}")

    def _on_control_message(self, peer: bytes, message: P.Message) -> None:
        worker = self.coordinator.by_peer(peer)
        if worker is not None:
            refused = self.pool.on_message(worker, message)
            if refused:
                self.rejects.reject(who_of(peer), refused)
            return
        session = self.stage.sessions.get(peer)
        if session is not None:
            session.last_seen = time.monotonic()
        if isinstance(message, P.Hello):
            refused = self.pool.hello(peer, message)
            if refused:
                self.rejects.reject(who_of(peer), refused)
        elif isinstance(message, P.ClientHello):
            refused = self.clients.hello(peer, message)
            if refused:
                self.rejects.reject(who_of(peer), refused)
        elif isinstance(message, P.Status):
            self._router.send(peer, P.encode(P.Status(status=self.status())))
        elif session is None:
            if not isinstance(message, P.Bye):
                self._router.send(
                    peer,
                    P.encode(
                        P.Error(unknown_session=True, message="the daemon does not know this client (restarted?)")
                    ),
                )
        else:
            refused = self.clients.on_message(session, message)
            if refused:
                self.rejects.reject(who_of(peer), refused)

    # -- status -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: workers, files, rates, queue depths, clients, skipped records."""
        now = time.monotonic()
        elapsed = max(1e-9, now - self._started_at)
        return {
            "endpoint": self.endpoint,
            "data_endpoint": self.data_endpoint,
            "config": self._config_path,  # so `loader status OTHER.toml` can tell it reached another daemon
            "uptime_s": round(elapsed, 3),
            "files": {
                "total": sum(len(d.files) for d in self.datasets.by_name.values()),
                # Entries of the lease list: fewer than files with lease groups, more with pieces of files.
                "leases": len(self.files),
                "granted": self.coordinator.leases_granted,
                "leased": self.coordinator.leased(),
                "queued": self.coordinator.queued(),
                "taken_back": self.coordinator.taken_back,  # leases ahead returned from behind a slow file
            },
            "datasets": [d.describe() for d in self.datasets.by_name.values()],
            "transport": self.config.workers.transport,
            "workers": self.pool.describe(now),
            "worker_restarts": self.coordinator.restarts,
            "samples_in": self.stage.samples_in,
            "samples_per_s": round(self._rate.per_second(now, self.stage.samples_in), 1),  # last ~10 s
            "samples_per_s_average": round(self.stage.samples_in / elapsed, 1),  # since the daemon started
            "buffered_samples": self.stage.buffered_rows(),
            "buffered_bytes": self.stage.buffered_bytes(),  # estimated, as service.stream_buffer_mib counts them
            "duplicates_dropped": self.stage.dropped_duplicates,
            "skipped_records": self.stage.skipped_records,
            "rejected_records": self.stage.rejected_records,  # did not fit their batch (under skip, also skipped)
            "rejected_messages": self.rejected_messages,
            "late_data_dropped": self.late_data,
            "shm_arenas": len(self.arenas.arenas) if self.arenas is not None else 0,
            "metrics": self.metrics.address if self.metrics is not None else None,
            "clients": [
                {
                    "session": s.session_id,
                    "dataset": s.dataset,
                    "rank": s.rank,
                    "world_size": s.world_size,
                    "job": s.job,
                    "credits": s.credits,
                    # The epoch it reads, else the one it was sent last and may still be reading (as the
                    # loader_epoch gauge shows it; "-" while the daemon had sent a whole epoch ahead).
                    "epoch": progress[0] if (progress := s.epoch_progress()) else None,
                    # Files of that epoch, and how many are read completely (what is left: the rest).
                    "epoch_files": progress[1] if progress else None,
                    "epoch_files_done": progress[2] if progress else None,
                    "batches_sent": s.batches_sent,
                    "samples_sent": s.samples_sent,
                    "wait_s": round(s.wait_s, 3),
                    # The epoch it asked for waits for the pace of epochs (``desk.EPOCH_PACING``): None when none.
                    "epoch_waiting": s.parked_epoch.epoch if s.parked_epoch is not None else None,
                    # Ranks of its job that never asked for the epoch it reads, which its batches wait for ("-").
                    "waiting_for_ranks": (
                        self.stage.missing_ranks(s.current, SHOWN_RANKS) if s.current is not None else []
                    )
                    or None,
                }
                for s in self.stage.sessions.values()
            ],
        }


def who_of(peer: bytes) -> str:
    return f"peer {peer.hex()[:32]}"


__all__ = ["Daemon", "MAX_FILE_ATTEMPTS"]
