"""Service configuration: TOML -> frozen dataclasses, checked on creation.

A config file has five tables, each one dataclass here::

    [source]    what to read        -> SourceConfig (in loader.config.source)
    [pipeline]  what to do with it  -> PipelineConfig
    [workers]   who does the work   -> WorkersConfig
    [service]   where the daemon listens -> ServiceConfig
    [client]    how loader.Loader's client receives -> ClientConfig

``configs/example.toml`` documents every key. Every check raises ``ConfigError``
naming the key, the value and the file, e.g.
``workers.count must be >= 1, got 0 (configs/train.toml)``; an unknown key is
rejected with the closest known key as a suggestion.

A config is plain data: ``"module:function"`` strings are kept as strings and
only imported by ``resolve`` when a process needs them, and ``to_dict()`` is
JSON/msgpack-able, so the coordinator can send it to a worker on another host
(``LoaderConfig.from_dict(config.to_dict())`` gives an equal config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from loader.config.checks import (
    DEFAULT_ORIGIN,
    Check,
    origin_field,
    plain,
    raise_unknown,
    reject_unknown,
    show,
    unknown_keys,
)
from loader.config.overrides import Override, culprits
from loader.config.overrides import apply as apply_overrides
from loader.config.overrides import collect as collect_overrides
from loader.config.overrides import sources as value_sources
from loader.config.source import SourceConfig, absolute_paths
from loader.config.text_file import MAX_TEXT_FILE_BYTES, read_text_file
from loader.errors import ConfigError
from loader.runtime.imports import add_import_path, call_problem, import_object, rng_parameter, rng_passing

DEFAULT_BIND = "tcp://127.0.0.1:5555"
TRANSPORTS = ("zmq", "pipe", "queue")
LAUNCHERS = ("local", "ray")  # where the daemon starts its workers (loader.service.daemon.launcher)
ON_ERROR_CHOICES = ("raise", "skip")
BATCH_FORMATS = ("stacked", "list")
# The most batches a client may have in flight. The daemon sends batches without blocking, and a zmq
# peer queues at most transport.sockets.HIGH_WATER_MARK (64) messages: with up to 32 batches and a
# few control messages (pong, end, error) queued, a slow receiver is never mistaken for a dead one.
MAX_PREFETCH = 32
MIN_RECLAIM_AFTER_S = 1.0  # service.reclaim_after_s: a batch's shared-memory rows are kept at least this long
# Sane limits: a value past one is a typo or a unit mistake, not a plan (each would exhaust memory,
# processes or patience before it did any good).
MAX_WORKERS = 1024
MAX_LEASES_AHEAD = 16  # leases a worker holds queued behind the file it reads (workers.leases_ahead)
MAX_CPUS_PER_WORKER = 1024.0
# Ray's resource granularity: a smaller CPU request is refused by Ray (1e-320 passed "> 0" here).
MIN_CPUS_PER_WORKER = 0.0001
# What ray.init accepts as workers.ray_address (None aside: a TOML file cannot say it). Any other scheme
# makes Ray import a module of that name; whitespace or a control character is a typo or a paste.
RAY_ADDRESS_FORMS = "'auto', 'local', 'HOST:PORT' or 'ray://HOST[:PORT]'"
_RAY_HOST = r"(?:\[[0-9A-Za-z:.%]+\]|[A-Za-z0-9._\-]+)"  # a name, an IPv4 or a bracketed IPv6 address
_RAY_ADDRESS = re.compile(rf"(?:ray://)?{_RAY_HOST}(?::(?P<port>[0-9]{{1,5}}))?")
MAX_BATCH_SIZE = 1 << 24
MAX_SHUFFLE_BUFFER = 1 << 28  # rows; the stage holds up to twice this many
MAX_SAMPLES_PER_MESSAGE = 1 << 20
MAX_KEEP_FREED_MIB = 2047  # mallopt takes an int of bytes
MAX_ARENA_MIB = 64 * 1024  # per worker, in /dev/shm
# A seed travels in every lease, whose integers stay below 2**62 (``protocol.MAX_INT``): a larger one passed
# here and every worker refused its first lease as malformed, leaving the epoch to fail as "worker exited".
MAX_SEED = (1 << 62) - 1
MAX_EPOCHS = 1 << 31
MAX_INTERVAL_S = 3600.0  # heartbeats
MIN_HEARTBEAT_INTERVAL_S = 0.01  # below it, pings are a busy loop
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # progress and client timeouts: a week
# The shortest timeout of a worker or a client (heartbeat, progress, answer, Ray's connect). A worker sends
# a chunk at least every 50 ms while it reads, but opening a file, a mapper's first sample or a busy host
# can keep a healthy peer silent for a few hundred ms: workers.progress_timeout_s = 1e-9 took every worker
# for hung and failed the epoch in 0.4 s. Below this, a value is a unit mistake (milliseconds for seconds).
MIN_TIMEOUT_S = 0.5
MAX_CLIENTS = 4096
MAX_MESSAGE_MIB = 4096  # one data frame; a bigger one is a sample no batch should hold
MAX_REORDER_WINDOW_MIB = 64 * 1024
MAX_STREAM_BUFFER_MIB = 1024 * 1024

# tcp://HOST:PORT (HOST may be [ipv6] or *; PORT may be * for "any free port"), or ipc://PATH
_TCP_BIND = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+):(?P<port>\d+|\*)$")
_IPC_BIND = re.compile(r"^ipc://\S+$")
_METRICS_ADDRESS = re.compile(
    r"^(\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+):(6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]?\d{1,4})$"
)
_DEVICE = re.compile(r"^(cpu|torch|torch:cpu|((torch|cupy):)?(cuda|gpu)(:\d+)?)$")
# What _DEVICE admits, in words (configs/example.toml documents each).
DEVICE_FORMS = (
    "'cpu', 'torch', 'torch:cpu', 'cuda', 'cuda:N', 'gpu' or 'gpu:N' "
    "(a GPU form may be prefixed with 'torch:' or 'cupy:', e.g. 'torch:cuda:0')"
)
_LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "[::1]", "::1"}


@dataclass(frozen=True)
class PipelineConfig:
    """What happens to samples between the file and the trainer."""

    mappers: tuple[str, ...] = ()
    # Functions of a block of samples (dict field -> array of n rows) -> such a dict, after ``mappers``.
    batch_mappers: tuple[str, ...] = ()
    shuffle_buffer: int = 0
    batch_size: int = 32
    drop_last: bool = False
    seed: int | None = None
    epochs: int = 1
    on_error: str = "raise"
    batch_format: str = "stacked"
    # The ``is_train`` a ``source.provider`` (PyDataProvider2) gets in its settings and init_hook: false for a
    # dataset served for evaluation (Paddle's test list), which the provider may read differently.
    is_train: bool = True
    origin: str = origin_field()

    def __post_init__(self) -> None:
        check = Check(self, "pipeline")
        for key in ("mappers", "batch_mappers"):
            check.texts(key)
            for spec in getattr(self, key):
                check.spec(key, spec)
        check.integer("shuffle_buffer", minimum=0, maximum=MAX_SHUFFLE_BUFFER)
        check.integer("batch_size", minimum=1, maximum=MAX_BATCH_SIZE)
        check.boolean("drop_last")
        if self.seed is not None:
            check.integer("seed", minimum=0, maximum=MAX_SEED)
        check.integer("epochs", minimum=0, maximum=MAX_EPOCHS)
        check.text("on_error", choices=ON_ERROR_CHOICES)
        check.text("batch_format", choices=BATCH_FORMATS)
        check.boolean("is_train")

    def resolve_mappers(self, key: str = "mappers") -> list[Any]:
        """The functions of ``mappers`` (or of ``batch_mappers``), in order (imported now)."""
        return [import_object(spec, what=f"pipeline.{key}") for spec in getattr(self, key)]


@dataclass(frozen=True)
class WorkersConfig:
    """Worker processes and how they talk to the stage."""

    count: int = 2
    transport: str = "zmq"
    # The most samples in one worker -> stage message; chunks also stop at about 1 MiB for blocks read
    # straight from a file, 4 MiB or 50 ms otherwise (workers/columns.py), so this is rarely what binds.
    samples_per_message: int = 4096
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 5.0
    # A worker that holds a lease and sends nothing for this long is taken for hung and replaced.
    progress_timeout_s: float = 120.0
    # Leases a worker holds queued behind the file it reads, so the next file starts without a round
    # trip to the coordinator (0: one file at a time). Off by default: it cost 10% on files of ~25 ms
    # (docs/performance.md); for many small files, source.files_per_lease saves more.
    leases_ahead: int = 0
    # Shared memory per worker for large arrays (MiB, reserved as used); 0 turns the fast path off.
    shm_arena_mib: int = 256
    # With an arena, large rows read straight from a local .npy/.npz go as references into the file itself
    # (the client reads them from the page cache: one copy); false sends them through the arena.
    file_rows: bool = True
    # Freed memory a worker's allocator keeps for the next samples (MiB, glibc; runtime/memory.py), so a
    # mapper's large outputs reuse pages instead of faulting in fresh ones; 0 keeps the allocator's defaults.
    keep_freed_mib: int = 512
    # Autoscaling of the daemon's own workers between min and max (max 0: a fixed pool of count).
    min: int = 1
    max: int = 0
    # "local": child processes of the daemon; "ray": Ray actors on a Ray cluster (the ray extra).
    launcher: str = "local"
    # With launcher "ray": the cluster ray.init connects to ("auto": the one running on this host or named
    # by RAY_ADDRESS; "local": a private Ray for this daemon; "HOST:PORT"; "ray://HOST:PORT"), and the CPUs
    # each worker's actor requests (fractions allowed).
    ray_address: str = "auto"
    ray_cpus_per_worker: float = 1.0
    # How long start-up waits for ray.init to reach ray_address before it fails in one line (where no
    # cluster answers, Ray retries for many minutes without a word); raise it for a head still starting.
    ray_connect_timeout_s: float = 60.0
    origin: str = origin_field()

    def __post_init__(self) -> None:
        check = Check(self, "workers")
        check.integer("shm_arena_mib", minimum=0, maximum=MAX_ARENA_MIB)
        check.boolean("file_rows")
        check.integer("keep_freed_mib", minimum=0, maximum=MAX_KEEP_FREED_MIB)
        check.integer("count", minimum=1, maximum=MAX_WORKERS)
        check.integer("leases_ahead", minimum=0, maximum=MAX_LEASES_AHEAD)
        check.integer("min", minimum=1, maximum=MAX_WORKERS)
        check.integer("max", minimum=0, maximum=MAX_WORKERS)
        if self.max and not self.min <= self.count <= self.max:
            check.fail("max", f"must be >= workers.count >= workers.min ({self.min}, {self.count}), got {self.max}")
        if not self.max and self.min not in (1, self.count):  # min means something only with max (autoscaling)
            check.fail("min", f"has no effect without workers.max (autoscaling off: count workers run), got {self.min}")
        check.text("transport", choices=TRANSPORTS)
        check.text("launcher", choices=LAUNCHERS)
        check.text("ray_address")
        if not _is_ray_address(self.ray_address):
            check.fail("ray_address", f"must be {RAY_ADDRESS_FORMS}, got {self.ray_address!r}")
        check.number("ray_cpus_per_worker", minimum=MIN_CPUS_PER_WORKER, maximum=MAX_CPUS_PER_WORKER)
        check.number("ray_connect_timeout_s", minimum=MIN_TIMEOUT_S, maximum=MAX_TIMEOUT_S)
        if self.launcher == "ray" and self.transport != "zmq":
            check.fail(
                "transport",
                f"must be 'zmq' with workers.launcher = 'ray' (actors reach the daemon over sockets), "
                f"got {self.transport!r}",
            )
        check.integer("samples_per_message", minimum=1, maximum=MAX_SAMPLES_PER_MESSAGE)
        # A microsecond interval had every worker and client ping in a busy loop.
        check.number("heartbeat_interval_s", minimum=MIN_HEARTBEAT_INTERVAL_S, maximum=MAX_INTERVAL_S)
        check.number("heartbeat_timeout_s", minimum=MIN_TIMEOUT_S, maximum=MAX_INTERVAL_S)
        check.number("progress_timeout_s", minimum=MIN_TIMEOUT_S, maximum=MAX_TIMEOUT_S)
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            check.fail(
                "heartbeat_timeout_s",
                f"must be greater than workers.heartbeat_interval_s ({self.heartbeat_interval_s}), "
                f"got {self.heartbeat_timeout_s}",
            )


def _is_ray_address(value: str) -> bool:
    """Whether ``value`` has one of ``RAY_ADDRESS_FORMS``, its port in 1..65535 (reachable or not: ray.init tells)."""
    if value in ("auto", "local"):
        return True
    found = _RAY_ADDRESS.fullmatch(value)
    if found is None:
        return False
    if found["port"] is None:
        return value.startswith("ray://")  # Ray's client has a default port; a cluster's address needs one
    return 0 < int(found["port"]) <= 65535


@dataclass(frozen=True)
class ServiceConfig:
    """Where the daemon listens.

    The default binds the loopback interface only; another address is used
    only when a config (or ``--bind``) names it explicitly.
    """

    bind: str = DEFAULT_BIND
    # The port of the data socket (workers send samples there), on bind's host; 0: any free port (logged).
    data_port: int = 0
    # CURVE authentication (docs/security.md): the daemon's secret key file and a directory of admitted public keys.
    daemon_key: str | None = None
    authorized_keys: str | None = None
    # A worker's or client's own secret key file, and the daemon's public key file.
    peer_key: str | None = None
    daemon_public_key: str | None = None
    # Bind beyond loopback without authentication: anyone who can reach the port reads the data.
    insecure: bool = False
    # Caps on peers: what a flood of hellos can make the daemon hold.
    max_workers: int = 64
    max_clients: int = 64
    # Largest data message (one frame) the daemon accepts from a worker; a bigger one disconnects the sender.
    max_message_mib: int = 256
    # Shared-memory rows sent to a client stay reserved this long at most when it returns no credit for them.
    reclaim_after_s: float = 60.0
    # Rows of later files held per stream until the file before them is complete (the reorder window):
    # a slow worker delays its stream by at most this, and it bounds that part of the daemon's memory.
    reorder_window_mib: int = 64
    # Rows one stream (an epoch of a job) may hold in the daemon besides its reorder window: shuffle buffer,
    # steps cut ahead of its ranks. Prefetch is cut to fit; a job whose shuffle buffer (twice: the shuffle
    # holds two before any row leaves) and one global step (world_size x batch_size rows), in rows of their
    # mean size, do not fit fails its epoch saying so (a huge world_size would buffer the whole dataset).
    stream_buffer_mib: int = 4096
    metrics: str = ""  # "HOST:PORT" of the Prometheus, /healthz and /readyz endpoint; "" for none
    origin: str = origin_field()

    def __post_init__(self) -> None:
        check = Check(self, "service")
        for key in ("daemon_key", "authorized_keys", "peer_key", "daemon_public_key"):
            check.text(key, optional=True)
        check.boolean("insecure")
        check.integer("max_workers", minimum=1, maximum=MAX_WORKERS)
        check.integer("max_clients", minimum=1, maximum=MAX_CLIENTS)
        check.integer("max_message_mib", minimum=1, maximum=MAX_MESSAGE_MIB)
        # A client refuses a batch copied within KEPT_MARGIN_S (0.25 s) of when its rows stop being kept: below a
        # second, every shared-memory batch of a loaded machine would be refused.
        check.number("reclaim_after_s", minimum=MIN_RECLAIM_AFTER_S, maximum=MAX_TIMEOUT_S)
        check.integer("reorder_window_mib", minimum=0, maximum=MAX_REORDER_WINDOW_MIB)
        check.integer("stream_buffer_mib", minimum=1, maximum=MAX_STREAM_BUFFER_MIB)
        if (self.daemon_key is None) != (self.authorized_keys is None):
            check.fail("authorized_keys", "and service.daemon_key go together: give both or neither")
        check.text("bind")
        if not isinstance(self.metrics, str) or (self.metrics and _METRICS_ADDRESS.match(self.metrics) is None):
            check.fail("metrics", f"must look like 'HOST:PORT' (PORT 0 for any free port), got {self.metrics!r}")
        tcp = _TCP_BIND.match(self.bind)
        if tcp is None and _IPC_BIND.match(self.bind) is None:
            check.fail("bind", f"must look like 'tcp://HOST:PORT' or 'ipc://PATH', got {self.bind!r}")
        if tcp is not None and tcp["port"] != "*" and not 0 <= int(tcp["port"]) <= 65535:
            check.fail("bind", f"has a port outside 0..65535, got {self.bind!r}")
        check.integer("data_port", minimum=0, maximum=65535)
        if self.data_port and tcp is None:
            check.fail("data_port", f"is a TCP port, but service.bind is {self.bind!r}")
        if self.data_port and tcp is not None and tcp["port"] == str(self.data_port):
            check.fail("data_port", f"is service.bind's own port ({self.data_port}): the two sockets need two")

    @property
    def is_loopback(self) -> bool:
        """True when only this host can connect (loopback TCP or an ipc:// path)."""
        tcp = _TCP_BIND.match(self.bind)
        return tcp is None or tcp["host"] in _LOOPBACK_HOSTS or tcp["host"].startswith("127.")

    @property
    def authenticated(self) -> bool:
        """True when the daemon admits only listed keys (CURVE)."""
        return self.daemon_key is not None


@dataclass(frozen=True)
class ClientConfig:
    """What the in-process ``loader.Loader`` passes to its ``Client`` (a ``Client`` made by hand takes its own arguments)."""

    prefetch: int | str = "auto"  # or 1..MAX_PREFETCH messages (Client's ``prefetch``)
    device: str = "cpu"
    timeout_s: float = 30.0
    # The longest an epoch waits for its next batch from a daemon that answers but sends nothing.
    progress_timeout_s: float = 600.0
    origin: str = origin_field()

    def __post_init__(self) -> None:
        check = Check(self, "client")
        check.number("progress_timeout_s", minimum=MIN_TIMEOUT_S, maximum=MAX_TIMEOUT_S)
        if isinstance(self.prefetch, str) and self.prefetch != "auto":
            check.fail("prefetch", f'must be "auto" or an integer from 1 to {MAX_PREFETCH}, got {self.prefetch!r}')
        if self.prefetch != "auto":
            check.integer("prefetch", minimum=1, maximum=MAX_PREFETCH)
        check.text("device")
        if not _DEVICE.match(self.device):
            check.fail("device", f"must be {DEVICE_FORMS}, got {self.device!r}")
        check.number("timeout_s", minimum=MIN_TIMEOUT_S, maximum=MAX_TIMEOUT_S)


_TOP_KEYS = ("import_path", "datasets")  # keys outside the sections
DEFAULT_DATASET = "default"  # the dataset of [source] and [pipeline]
_DATASET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_DATASET_SECTIONS = ("source", "pipeline")


@dataclass(frozen=True)
class DatasetConfig:
    """A further dataset served by the same daemon and workers: ``[datasets.NAME.source]`` and
    ``[datasets.NAME.pipeline]`` (its own files, batch size, epochs, seed, mappers)."""

    name: str
    source: SourceConfig
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)


_SECTIONS: dict[str, type] = {
    "source": SourceConfig,
    "pipeline": PipelineConfig,
    "workers": WorkersConfig,
    "service": ServiceConfig,
    "client": ClientConfig,
}


def _refuse_assignment(section: str | None) -> Any:
    """A frozen config's ``__setattr__`` whose error shows the way to a changed copy: dataclasses' own says
    only "cannot assign to field 'count'", and a new user's next guess is to build the config again by hand."""

    def refuse(self: Any, name: str, value: Any) -> None:
        if section is not None:
            dotted = f"{section}.{name}"
        else:
            dotted = f"{name}.KEY" if name in _SECTIONS else name
        raise dataclasses.FrozenInstanceError(
            f"cannot assign to field {name!r}: a config is read-only; make a changed copy with "
            f"config.override({{{dotted!r}: value}})"
        )

    return refuse


@dataclass(frozen=True)
class LoaderConfig:
    """A whole service config; build it with ``load_config`` or ``from_dict``."""

    source: SourceConfig
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    # Directories searched for mapper/reader/provider modules (after sys.path); relative to the config file.
    import_path: tuple[str, ...] = (".",)
    # Further named datasets; [source] and [pipeline] are the dataset named "default".
    datasets: tuple[DatasetConfig, ...] = ()
    origin: str = origin_field()
    # {dotted key: "default", the file, or the variable or flag that set it} (load_config; loader check)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        paths = self.import_path
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p for p in paths):
            raise ConfigError(f"import_path must be a list of directories, got {show(paths)} ({self.origin})")
        object.__setattr__(self, "import_path", tuple(paths))
        for dataset in (None, *self.datasets):
            source, pipeline = (self.source, self.pipeline) if dataset is None else (dataset.source, dataset.pipeline)
            if not pipeline.is_train and source.provider is None:
                where = "" if dataset is None else f"datasets.{dataset.name}."
                raise ConfigError(
                    f"{where}pipeline.is_train = false has no effect without {where}source.provider (only a "
                    f"PyDataProvider2 provider is told is_train): remove it ({self.origin})"
                )

    @classmethod
    def from_dict(
        cls, mapping: Mapping[str, Any], origin: str = DEFAULT_ORIGIN, *, base_dir: str | None = None
    ) -> LoaderConfig:
        """Build and check a config from nested mappings (a parsed TOML file, or ``to_dict()``).

        Relative paths in ``source`` are made absolute against ``base_dir``
        (the config file's directory for ``load_config``; the current directory
        when None), so the config means the same thing in any process; so are
        the ``service`` key files when ``base_dir`` is given.
        """
        if not isinstance(mapping, Mapping):
            raise ConfigError(f"a config must be a table of sections, got {show(mapping)} ({origin})")
        raise_unknown(_unknown_keys(mapping), origin)  # every unknown key of the file at once
        sections: dict[str, Any] = {}
        base = os.path.abspath(base_dir) if base_dir is not None else os.getcwd()
        import_path = mapping.get("import_path", ["."])
        if isinstance(import_path, (list, tuple)):
            import_path = [
                os.path.normpath(os.path.join(base, os.path.expanduser(p))) if isinstance(p, str) and p else p
                for p in import_path
            ]
        sections["import_path"] = import_path
        sections["datasets"] = _datasets(mapping.get("datasets", {}), origin, base_dir)
        for name, section_cls in _SECTIONS.items():
            values = mapping.get(name, {})
            if not isinstance(values, Mapping):
                raise ConfigError(f"{name} must be a table, got {show(values)} ({origin})")
            known = {f.name for f in dataclasses.fields(section_cls)} - {"origin"}
            reject_unknown(values.keys(), known, f"{name}.", origin)
            values = dict(values)
            if name == "source":
                values = absolute_paths(values, base_dir)
            if name == "service" and base_dir is not None:
                values = _absolute_key_paths(values, base_dir)
            sections[name] = _build(section_cls, values, origin)
        return cls(**sections, origin=origin)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts, lists and scalars (JSON- and msgpack-able); ``from_dict`` reverses it."""
        out: dict[str, Any] = {}
        for name in _SECTIONS:
            section = getattr(self, name)
            out[name] = {
                f.name: plain(getattr(section, f.name)) for f in dataclasses.fields(section) if f.name != "origin"
            }
        out["import_path"] = list(self.import_path)
        out["datasets"] = {
            d.name: {name: _plain_section(getattr(d, name)) for name in _DATASET_SECTIONS} for d in self.datasets
        }
        return out

    @property
    def dataset_names(self) -> list[str]:
        """``"default"`` and the names of ``datasets``, in the config's order."""
        return [DEFAULT_DATASET, *(d.name for d in self.datasets)]

    def dataset(self, name: str) -> LoaderConfig:
        """This config with ``source`` and ``pipeline`` of the dataset ``name`` (``ConfigError`` if unknown)."""
        if name == DEFAULT_DATASET:
            return self
        for candidate in self.datasets:
            if candidate.name == name:
                return dataclasses.replace(self, source=candidate.source, pipeline=candidate.pipeline)
        raise ConfigError(f"no dataset named {name!r}; this config has {', '.join(map(repr, self.dataset_names))}")

    def override(self, changes: Mapping[str, Any], *, origin: str = "command line") -> LoaderConfig:
        """A copy with dotted keys replaced (``{"workers.count": 4}``), checked like a file.

        Errors name ``origin`` (the values came from there); the copy keeps this config's origin.
        """
        data = self.to_dict()
        for dotted, value in changes.items():
            section, _, key = dotted.partition(".")
            if not key and section in _TOP_KEYS:
                data[section] = value
                continue
            reject_unknown([section], _SECTIONS, "", origin)
            reject_unknown([key], set(data[section]), f"{section}.", origin)
            data[section][key] = value
        LoaderConfig.from_dict(data, origin=origin)
        return LoaderConfig.from_dict(data, origin=self.origin)

    def add_import_path(self) -> None:
        """Make ``import_path`` searchable in this process (the daemon and every worker call it first)."""
        add_import_path(self.import_path)

    def check_imports(self) -> None:
        """Import every ``"module:function"`` and look up ``source.format`` now.

        So a typo fails at start-up (``loader serve``, ``loader check``), not in
        every worker. Not called on creation: a config may name code that only
        the worker hosts have.
        """
        self.add_import_path()
        with self._named():
            for name in self.dataset_names[1:]:
                try:
                    self.dataset(name)._check_dataset_imports(name)
                except ConfigError as exc:  # name the key as the file spells it: datasets.NAME.pipeline.mappers
                    text = str(exc)
                    where = f"datasets.{name}." if text.startswith(("source.", "pipeline.")) else f"datasets.{name}: "
                    raise ConfigError(where + text) from exc
            self._check_dataset_imports(DEFAULT_DATASET)

    def expand_files(self) -> list[str]:
        """``source.expand_files()``, whose errors name where the value came from (a flag, a variable, the file)."""
        with self._named():
            return self.source.expand_files()

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """A ``ConfigError`` from resolving user code or files names where the key's value came from: the
        config file, or the ``--set`` flag or variable that replaced it (a section blamed the file for both)."""
        try:
            yield
        except ConfigError as exc:
            text, source = str(exc), self._source_of(str(exc))
            blamed = f" ({self.origin})"
            # The same words again, with where they came from: chained to what caused them (a user's module that
            # raised on import: its traceback is the one to read), not to themselves, which printed them twice.
            if self.origin not in text:
                raise ConfigError(f"{text} ({source})") from exc.__cause__
            if source == self.origin or not text.endswith(blamed):
                raise
            raise ConfigError(f"{text[: -len(blamed)]} ({source})") from exc.__cause__

    def _source_of(self, message: str) -> str:
        """Where the key a message starts with got its value (``--set ...``, a variable), else the file."""
        found = re.match(r"[a-z_]+(?:\.[a-z_]+)+", message)
        key = found.group() if found else ""
        while key:
            source = self.sources.get(key)
            if source is not None:
                return self.origin if source == "default" else source
            key = key.rpartition(".")[0]
        return self.origin

    def _check_dataset_imports(self, name: str) -> None:
        self.source.register_formats()
        if self.source.format is not None:
            from loader.io.registry import registered_formats

            known = registered_formats()
            if self.source.format not in known:
                raise ConfigError(
                    f"source.format {self.source.format!r} is not a registered format "
                    f"(known: {', '.join(sorted(known))}) ({self.origin})"
                )
        _callable("source.reader", self.source.resolve_reader())
        provider = self.source.resolve_provider()
        # A plain process(settings, filename) passed here and failed every epoch in the workers.
        if provider is not None and not callable(getattr(provider, "open", None)):
            raise ConfigError(
                f"source.provider {self.source.provider!r} is not a @loader.provider.provider function: decorate it "
                f"with @provider(input_types=...) (docs/paddle.md) ({self.origin})"
            )
        if provider is not None:
            from loader.provider.daemon import warn_daemon_options

            # Its pooling, weighing and caching options act only in process: said once, here, where `loader serve`,
            # `loader check` and Loader check the config, rather than by every worker at every lease.
            warn_daemon_options(provider, name, self.pipeline)
        for key in ("mappers", "batch_mappers"):
            for spec, mapper in zip(getattr(self.pipeline, key), self.pipeline.resolve_mappers(key)):
                _callable(f"pipeline.{key} ({spec!r})", mapper)
                how = "plain"
                if key == "mappers":
                    try:
                        how = rng_passing(mapper)
                    except ValueError as exc:
                        raise ConfigError(f"pipeline.mappers ({spec!r}): {exc} ({self.origin})") from None
                if key == "batch_mappers" and rng_parameter(mapper) is not None:
                    raise ConfigError(
                        f"pipeline.batch_mappers ({spec!r}) takes an rng parameter: batch mappers get no "
                        'generator, since a batch mapper must be row-wise (docs/internals.md, "Batch mappers")'
                    )
                # Called as f(sample) / f(sample, rng) / f(block): one that cannot be failed every sample, at run time.
                problem = call_problem(mapper, 1, how)
                if problem is not None:
                    shape = {"plain": "f(sample)", "keyword": "f(sample, rng=rng)", "positional": "f(sample, rng)"}
                    call = "f(block)" if key == "batch_mappers" else shape[how]
                    raise ConfigError(
                        f"pipeline.{key} ({spec!r}) cannot be called as {call}: {problem} ({self.origin})"
                    )
        parser = self.source.file_reader_options().get("parser")
        if parser is not None:
            _callable("source.format_options.parser", parser)


for _name, _section_cls in _SECTIONS.items():
    _section_cls.__setattr__ = _refuse_assignment(_name)  # type: ignore[method-assign]
LoaderConfig.__setattr__ = _refuse_assignment(None)  # type: ignore[method-assign]


def _callable(what: str, obj: Any) -> None:
    if obj is not None and not callable(obj):
        raise ConfigError(f"{what} must name a function or other callable, got a {type(obj).__name__}")


def _plain_section(section: Any) -> dict[str, Any]:
    return {f.name: plain(getattr(section, f.name)) for f in dataclasses.fields(section) if f.name != "origin"}


# Key files named in a config file are found beside it, as its [source] paths are (a relative path resolved
# against the directory the command ran in failed to read the key when started from elsewhere).
_KEY_PATHS = ("daemon_key", "authorized_keys", "peer_key", "daemon_public_key")


def _absolute_key_paths(values: dict[str, Any], base_dir: str) -> dict[str, Any]:
    for key in _KEY_PATHS:
        path = values.get(key)
        if isinstance(path, str) and path:
            path = os.path.expanduser(path)
            values[key] = path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))
    return values


def _section_keys(section_cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(section_cls)} - {"origin"}


def _unknown_keys(mapping: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every unknown section and key of a config's tables (``unknown_keys``), datasets' tables too."""
    found = unknown_keys(mapping.keys(), {*_SECTIONS, *_TOP_KEYS}, "")
    tables = [(name, mapping.get(name), name) for name in _SECTIONS]
    datasets = mapping.get("datasets")
    if isinstance(datasets, Mapping):
        for name, dataset in datasets.items():
            if not isinstance(dataset, Mapping):
                continue
            found += unknown_keys(dataset.keys(), _DATASET_SECTIONS, f"datasets.{name}.")
            tables += [(section, dataset.get(section), f"datasets.{name}.{section}") for section in _DATASET_SECTIONS]
    for section, values, where in tables:
        if isinstance(values, Mapping):
            found += unknown_keys(values.keys(), _section_keys(_SECTIONS[section]), f"{where}.")
    return found


def _datasets(value: Any, origin: str, base_dir: str | None) -> tuple[DatasetConfig, ...]:
    """``[datasets.NAME.source]`` / ``[datasets.NAME.pipeline]`` tables, checked like the top-level ones."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"datasets must be a table of named datasets, got {show(value)} ({origin})")
    found = []
    for name, tables in value.items():
        where = f"datasets.{name}"
        if not isinstance(name, str) or not _DATASET_NAME.match(name) or name == DEFAULT_DATASET:
            raise ConfigError(f"{where}: a dataset name must be a word other than {DEFAULT_DATASET!r} ({origin})")
        if not isinstance(tables, Mapping) or "source" not in tables:
            raise ConfigError(f"{where} must be a table with a source table (and optionally pipeline) ({origin})")
        reject_unknown(tables.keys(), _DATASET_SECTIONS, f"{where}.", origin)
        built: dict[str, Any] = {}
        for section in _DATASET_SECTIONS:
            values = tables.get(section, {})
            if not isinstance(values, Mapping):
                raise ConfigError(f"{where}.{section} must be a table, got {show(values)} ({origin})")
            section_cls = _SECTIONS[section]
            known = {f.name for f in dataclasses.fields(section_cls)} - {"origin"}
            reject_unknown(values.keys(), known, f"{where}.{section}.", origin)
            values = absolute_paths(dict(values), base_dir) if section == "source" else dict(values)
            try:
                built[section] = _build(section_cls, values, origin)
            except ConfigError as exc:  # the section checks name "source.x": say which dataset
                raise ConfigError(f"{where}: {exc}") from exc
        found.append(DatasetConfig(name=name, **built))
    return tuple(found)


# The first bytes of the data files a config names, by what they are: given where a config was asked for.
_DATA_MAGICS = ((b"\x93NUMPY", ".npy array"), (b"PK\x03\x04", "zip archive, as an .npz"))
_DATA_SUFFIXES = (".npy", ".npz", ".recordio", ".rec", ".jpg", ".jpeg", ".png")


def _data_file_kind(path: str) -> str | None:
    """What data file ``path`` is (from its first bytes or its name), or None for anything else."""
    try:
        with open(path, "rb") as file:
            start = file.read(8)
    except OSError:
        return None
    for magic, kind in _DATA_MAGICS:
        if start.startswith(magic):
            return kind
    suffix = os.path.splitext(path)[1].lower()
    return f"a {suffix} file" if suffix in _DATA_SUFFIXES else None


def load_config(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str | Override] | Mapping[str, Any] = (),
    environ: Mapping[str, str] | None = None,
) -> LoaderConfig:
    """Read and check a TOML config file, with ``LOADER_SECTION__KEY`` variables of ``environ`` (default
    ``os.environ``) and then ``overrides`` over it (``loader.config.overrides``): ``"section.key=value"``
    strings as ``--set`` takes them, or a mapping ``{"section.key": value}``."""
    if isinstance(path, Mapping):
        # A config written as a dict: os.fspath said only "expected str, bytes or os.PathLike object, not dict".
        raise TypeError(
            "load_config reads a TOML file given by its path; a dict of sections is a config through "
            "loader.config.LoaderConfig.from_dict(d) (relative paths in it are relative to the working directory)"
        )
    origin = os.fspath(path)
    try:
        data = tomllib.loads(read_text_file(origin, "config file", "a loader config (a TOML file)", MAX_CONFIG_BYTES))
    except FileNotFoundError:
        raise ConfigError(f"config file {origin!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {origin!r} cannot be read: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        data_file = _data_file_kind(origin)
        if data_file is not None:
            # DataLoader("data/part-0.npy") said only "'utf-8' codec can't decode byte 0x93".
            raise ConfigError(
                f"{origin!r} is a data file ({data_file}), not a config: a config (a TOML file) names it under "
                f'[source], files = ["{origin}"]'
            ) from None
        raise ConfigError(f"config file {origin!r} is not valid TOML: {exc}") from exc
    except RecursionError:  # the parser recurses per nested array or table
        raise ConfigError(f"config file {origin!r} nests arrays or tables too deeply") from None
    applied = collect_overrides(overrides, environ)
    try:
        config = LoaderConfig.from_dict(
            apply_overrides(data, applied, {*_SECTIONS, *_TOP_KEYS}),
            origin=origin,
            base_dir=os.path.dirname(os.path.abspath(origin)),
        )
    except ConfigError as exc:
        blamed = culprits(str(exc), applied)  # the message names the variable or flag, not the file
        if not blamed:
            raise
        if _unknown_keys(data):  # unknown keys of the file too, in the same message
            blamed = [origin, *blamed]
        raise ConfigError(str(exc).replace(f"({origin})", f"({', '.join(blamed)})")) from None
    return dataclasses.replace(config, sources=value_sources(config.to_dict(), data, applied, origin))


# The most bytes a config file may hold (``text_file.read_text_file``; a config naming every file of a dataset can
# be megabytes).
MAX_CONFIG_BYTES = MAX_TEXT_FILE_BYTES


def resolve(spec: str, what: str = "object") -> Any:
    """Import a ``"module:function"`` string (``ConfigError`` when it cannot)."""
    return import_object(spec, what=what)


def _build(section_cls: type, values: dict[str, Any], origin: str) -> Any:
    try:
        return section_cls(**values, origin=origin)
    except TypeError as exc:  # pragma: no cover - unknown keys are rejected before this
        raise ConfigError(f"{exc} ({origin})") from exc
