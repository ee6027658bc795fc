"""The ``loader`` command: parse arguments and call library code (no logic of its own).

::

    loader serve CONFIG [--bind ADDR] [--workers N] [--set SECTION.KEY=VALUE] [--address-file PATH]
                                                      run the daemon until Ctrl-C / SIGTERM
    loader status [ADDRESS|HOST:PORT|CONFIG] [--json] [--watch [S]]   ask a running daemon how it is doing
                                                      (no address: LOADER_ADDRESS, else the default bind)
    loader worker --connect ADDRESS|HOST:PORT         run one worker by hand (any host)
    loader check CONFIG [--set K=V] [--no-batch]      validate a config; count samples per field; first batch
    loader gen-data DIR --format npy|npz|recordio --files N --samples M   synthetic data
    loader recordio convert SRC DST [--allow-pickle]  rewrite a PaddlePaddle RecordIO file as ours

This is the composition root: the one place in ``loader`` that imports
``workers``. Every error a user can cause ends as one line on stderr
(``loader: error: ...``) and a non-zero exit; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import loader
from loader.config.overrides import format_sources
from loader.errors import LoaderError, ServiceUnavailableError, WorkerError
from loader.service.address_file import remove_address_file, write_address_file

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
STATUS_TIMEOUT_S = 5.0
WATCH_INTERVAL_S = 1.0
WATCH_MIN_S = 0.1  # a daemon asked more often spends its control loop on status
WATCH_MAX_S = 86_400.0
log = logging.getLogger("loader.cli")


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load_checked(args.config, {"service.bind": args.bind, "workers.count": args.workers}, args.set)
    from loader.service.daemon.loop import Daemon  # after the config checks: they need no zmq

    stop = threading.Event()
    with _stop_on_signals(stop):
        with Daemon(config) as daemon:
            endpoint = daemon.endpoint  # the real port when bound to "*"
            if args.address_file:
                write_address_file(args.address_file, endpoint)
            workers = config.workers
            log.info("serving %s on %s with %d %s workers", args.config, endpoint, workers.count, workers.launcher)
            if not config.service.is_loopback and not config.service.authenticated:
                log.warning("%s is reachable from other hosts: anyone who can connect can read the data", endpoint)
            try:
                daemon.serve(stop)
            finally:
                if args.address_file:
                    remove_address_file(args.address_file, endpoint)
    log.info("stopped")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from loader.config.address import address_origin, daemon_address
    from loader.config.sections import MAX_TIMEOUT_S
    from loader.service.client.ask import query_status
    from loader.service.client.env import ADDRESS_VARIABLE
    from loader.service.transport.auth import peer_for

    # Before any query: --timeout -1 waited "within -1 s"; inf (or 1e300) ended in OverflowError inside zmq.
    if not args.timeout > 0:
        raise LoaderError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if not args.timeout <= MAX_TIMEOUT_S:  # client.timeout_s's bound: a week
        raise LoaderError(f"--timeout must be at most {MAX_TIMEOUT_S:g} seconds (a week), got {args.timeout:g}")
    watch_s = _watch_interval(args)
    given = args.address or os.environ.get(ADDRESS_VARIABLE) or None  # as a Client given no address
    address = daemon_address(given)
    curve = peer_for(given)  # a config file's keys go with its address

    def query() -> dict[str, Any]:
        try:
            return query_status(address, timeout_s=args.timeout, curve=curve)
        except ServiceUnavailableError as exc:  # an address from a config file: say so, and how else to look
            note = address_origin(given)
            if not note:
                raise
            raise ServiceUnavailableError(f"{exc}{note}") from None

    if watch_s is None:
        status = query()
        _note_another_config(given, address, status)
        print(_render_status(status, args.json))
        return EXIT_OK
    stop = threading.Event()
    with _stop_on_signals(stop):
        while not stop.is_set():
            text = _render_status(query(), args.json)
            # Home the cursor and clear below it: the view refreshes in place, like top(1).
            sys.stdout.write(f"\x1b[H\x1b[J{address}  (every {watch_s:g} s, Ctrl-C to stop)\n{text}\n")
            sys.stdout.flush()
            stop.wait(watch_s)
    return EXIT_OK


def _watch_interval(args: argparse.Namespace) -> float | None:
    """--watch's seconds, or None without it; `--watch ADDRESS` means the default interval.

    --watch takes an optional value, so argparse hands it the address that follows it
    (`loader status --watch tcp://host:5555`): a value that is not a number is that address.
    """
    if args.watch is None:
        return None
    try:
        seconds = float(args.watch)
    except ValueError:
        if args.address is not None:
            raise LoaderError(f"--watch takes seconds, got {args.watch!r}") from None
        args.address = args.watch
        return WATCH_INTERVAL_S
    # --watch 0 sent thousands of queries a second; inf could not be waited on.
    if not WATCH_MIN_S <= seconds <= WATCH_MAX_S:
        raise LoaderError(f"--watch must be {WATCH_MIN_S:g} to {WATCH_MAX_S:g} seconds, got {args.watch}")
    return seconds


def _note_another_config(given: str | None, address: str, status: dict[str, Any]) -> None:
    """When asked by a config file, say so if the daemon at its address serves another config."""
    from loader.config.address import another_config

    other = another_config(given, status.get("config"))
    if other is not None:
        print(f"loader: note: the daemon at {address} serves {other}, not {given}", file=sys.stderr)


def _render_status(status: dict[str, Any], as_json: bool) -> str:
    if not as_json:
        return format_status(status)
    # JSON has no NaN or infinity: json.dumps wrote them bare (NaN, Infinity), which JSON readers refuse.
    # A number that is not one is shown as null, "no value", as the text view shows None.
    return json.dumps(_finite(status), indent=2, sort_keys=True, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float in it replaced by None (the status is nested a few deep)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def cmd_worker(args: argparse.Namespace) -> int:
    from loader.config.address import daemon_address
    from loader.service.transport.auth import ENV_DAEMON_PUBLIC_KEY, ENV_PEER_KEY, Dial, peer_keys
    from workers.main import EXIT_NO_DAEMON, run_worker

    address = daemon_address(args.connect)  # HOST:PORT, ipc://PATH or a config file, as `loader status` takes
    connect: Any = address
    key, daemon_public = args.key, args.daemon_public_key
    if args.config and not (key and daemon_public):
        from loader.config import load_config

        service = load_config(args.config).service  # only its keys: the files may live elsewhere
        key, daemon_public = key or service.peer_key, daemon_public or service.daemon_public_key
    # Each one still missing from its own variable: --key with LOADER_DAEMON_PUBLIC_KEY is a whole pair.
    key = key or os.environ.get(ENV_PEER_KEY) or None
    daemon_public = daemon_public or os.environ.get(ENV_DAEMON_PUBLIC_KEY) or None
    curve = peer_keys(
        key,
        daemon_public,
        f"loader worker --key (or {ENV_PEER_KEY}) and --daemon-public-key (or {ENV_DAEMON_PUBLIC_KEY})",
    )
    if curve is not None:
        connect = Dial(address, curve)
    stop = threading.Event()
    with _stop_on_signals(stop):
        code = run_worker(connect, worker_id=args.id, stop_event=stop, connect_timeout_s=args.connect_timeout)
    if code == EXIT_NO_DAEMON and stop.is_set():
        log.info("stopped before a loader daemon answered at %s", address)  # by a signal, not a timeout
        return EXIT_OK
    if code == EXIT_NO_DAEMON:
        from loader.service.client.ask import no_answer_hint

        raise ServiceUnavailableError(
            f"no loader daemon answered at {address} within {args.connect_timeout:g} s{no_answer_hint(curve is not None)}"
        )
    return code


def cmd_keys(args: argparse.Namespace) -> int:
    """Key pairs for CURVE: the daemon's, and one per peer name, with the public ones it admits.

    Run again, it keeps every pair that exists (a new daemon pair would lock out every peer holding the
    old public key) and makes only what is missing; ``--force`` replaces the pairs it names."""
    import shutil

    from loader.service.transport.sockets import create_key_files

    names = args.peer or ["worker", "client"]
    daemon_public = os.path.join(args.dir, "daemon.key")
    daemon_secret = os.path.join(args.dir, "daemon.key_secret")
    if args.force or not (os.path.exists(daemon_public) or os.path.exists(daemon_secret)):
        replaced = os.path.exists(daemon_secret)
        daemon_public, daemon_secret = create_key_files(args.dir, "daemon")
        done = "replaced (peers holding the old daemon.key are locked out)" if replaced else "created"
    elif not (os.path.exists(daemon_public) and os.path.exists(daemon_secret)):
        missing = daemon_public if not os.path.exists(daemon_public) else daemon_secret
        raise LoaderError(f"{missing} is missing but its pair's other file exists: restore it, or --force a new pair")
    else:
        done = "kept (--force replaces it)"
    authorized = os.path.join(args.dir, "authorized")
    os.makedirs(authorized, mode=0o700, exist_ok=True)
    print(f"daemon {done}:  service.daemon_key = {daemon_secret!r}, service.authorized_keys = {authorized!r}")
    peers = os.path.join(args.dir, "peers")
    for name in names:
        public, secret = os.path.join(peers, f"{name}.key"), os.path.join(peers, f"{name}.key_secret")
        admitted = os.path.join(authorized, f"{name}.key")
        exists = [path for path in (public, secret, admitted) if os.path.exists(path)]
        if exists and not args.force:
            if os.path.exists(public) and not os.path.exists(admitted):
                shutil.copy(public, admitted)
            print(f"{name} kept ({', '.join(exists)} exist; --force replaces it)")
            continue
        public, secret = create_key_files(peers, name)
        shutil.copy(public, admitted)
        done = "replaced" if exists else "created"
        print(f"{name} {done}:  {ENV_PEER_KEY_HINT} {secret!r} and the daemon's public key {daemon_public!r}")
    return EXIT_OK


ENV_PEER_KEY_HINT = "service.peer_key (or LOADER_PEER_KEY) ="


def cmd_check(args: argparse.Namespace) -> int:
    # What the file listing leaves out (a dangling shard symlink) is check's warning line, said once, not a
    # log line each time the list is expanded (loading, the survey, the leases).
    with _KeptWarnings("loader.config") as listing:
        return _check(args, listing.lines)


def _check(args: argparse.Namespace, listed: list[str]) -> int:
    from loader.io.survey import survey
    from loader.service.daemon.loop import check_service

    config = _load_checked(args.config, {}, args.set)
    check_service(config)  # what `loader serve` refuses at start: check says it too
    # Every dataset's files, and its first batch, are read before "ok" is printed: a bad file, files a batch
    # cannot take together, or a mapper that fails on real data is the only line, not one after "ok".
    surveys = [(name, survey(config.dataset(name).source)) for name in config.dataset_names]
    errors: list[str] = []
    warnings: list[str] = []
    for name, found in surveys:
        _judge_survey(config.dataset(name).pipeline, f"dataset {name}", found, errors, warnings)
        _judge_dtypes(config.dataset(name), f"dataset {name}", found, errors, warnings)
    if errors:
        for line in errors:
            print(f"loader: error: {line}", file=sys.stderr)
        return EXIT_ERROR
    for line in [*dict.fromkeys(listed), *warnings]:
        print(f"loader: warning: {line}", file=sys.stderr)
    batches: dict[str, tuple[int, list[dict[str, str]]] | None] = {}
    if not args.no_batch:
        try:
            _read_first_batches(config, batches, {name: [f.name for f in found.fields] for name, found in surveys})
        except LoaderError as exc:
            name = next((name for name in config.dataset_names if name not in batches), config.dataset_names[0])
            print(f"loader: error: dataset {name}, first batch: {_error_line(exc)}", file=sys.stderr)
            return EXIT_ERROR
    from loader.service.daemon.datasets import DatasetTable

    # The leases `loader serve` would make: too many pieces is refused here too, and the hints its daemon logs
    # (records_per_lease for few files and many workers, ...) are check's warnings, not a log line among them.
    table = DatasetTable(config, advise=lambda line: print(f"loader: warning: {line}", file=sys.stderr))
    leases = {name: dataset.leases for name, dataset in table.by_name.items()}
    workers = config.workers.count
    print(f"{args.config}: ok, {workers} worker{'s' if workers != 1 else ''}, bind {config.service.bind}")
    for name, found in surveys:
        samples = "samples not counted (a provider)" if found.samples is None else f"{found.samples} samples"
        files = f"{found.files} file{'s' if found.files != 1 else ''}{_leased(config, name, leases)}"
        print(f"dataset {name}: {files}, {samples}")
        if found.fields:
            rows = [{"field": f.name, "shape": f.shape, "dtype": f.dtype} for f in found.fields]
            print("\n".join(_table(rows, "  ")))
        if name not in batches:
            continue
        described = batches[name]
        if described is None:
            print(
                f"  first batch: none (epoch 0 is empty after the pipeline: {_why_empty(config.dataset(name).pipeline)})"
            )
            continue
        count, rows = described
        print(f"  first batch, after the pipeline: {count} samples")
        print("\n".join(_table(rows, "    ")))
    print("settings (value, and where it came from):")
    print("\n".join(format_sources(config)))
    return EXIT_OK


class _KeptWarnings(logging.Handler):
    """Within ``with``, the WARNING lines of logger ``name`` are kept in ``lines`` instead of logged."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.WARNING)
        self.logger = logging.getLogger(name)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> _KeptWarnings:
        self.logger.addHandler(self)
        self._propagate, self.logger.propagate = self.logger.propagate, False
        return self

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeHandler(self)
        self.logger.propagate = self._propagate


def _named_positions(rows: list[dict[str, str]], names: list[str]) -> list[dict[str, str]]:
    """The rows of a list batch of tuples (or single values), whose fields ``describe_batch`` shows by position
    ("0", "1", ...), named as check's file section names them: each position the name of the file's field there,
    as the workers name a sample's values; positions past the names, or names that would repeat, stay numbers."""
    named = [names[i] if i < len(names) else str(i) for i in range(len(rows))]
    if len(set(named)) != len(named):
        return rows
    return [{**row, "field": field} for row, field in zip(rows, named)]


def _leased(config: Any, name: str, leases: dict[str, list[list[str]]]) -> str:
    """How ``loader check`` says a dataset's files are leased, where it is not one file a lease."""
    source = config.dataset(name).source
    if len(leases[name]) == len({path for lease in leases[name] for path in lease}):
        return ""
    key = "records_per_lease" if source.records_per_lease > 0 else "files_per_lease"
    return f" in {len(leases[name])} leases (source.{key} = {getattr(source, key)})"


ONE_DTYPE_FIX = (
    "a stacked batch needs one dtype per field: write the files with one dtype or cast it in a mapper "
    "(pipeline.batch_format = 'list' takes the samples as they are)"
)


def _judge_survey(pipeline: Any, dataset: str, found: Any, errors: list[str], warnings: list[str]) -> None:
    """What ``loader check`` says of a dataset's survey: errors for what no epoch can get past, warnings
    for files without samples and for differences the mappers may reconcile."""
    from loader.io.survey import shown

    empty = [f"{shown(path)} ({_why_no_samples(path)})" for path in found.empty]
    if found.files and len(found.empty) == found.files:
        listed = "; ".join(empty[:3]) + (f"; and {len(empty) - 3} more" if len(empty) > 3 else "")
        errors.append(f"{dataset} holds no samples: {listed}")
        return
    warnings += [f"{dataset}: no samples in {line}: it adds nothing to an epoch" for line in empty]
    mapped = bool(pipeline.mappers or pipeline.batch_mappers)
    for mismatch in found.mismatches:
        if mismatch.kind == "field count":
            if mapped:
                warnings.append(f"{dataset}: {mismatch.text}: the mappers must return that many fields")
            else:
                errors.append(f"{dataset}: {mismatch.text}: name each of them, in order, or leave source.fields out")
            continue
        if mismatch.kind == "fields":
            fix = "every file of a dataset needs the same fields"
        elif pipeline.batch_format == "list":
            continue  # a list batch holds each sample as it is
        elif mismatch.kind == "dtype":
            fix = ONE_DTYPE_FIX
        else:
            fix = (
                "a stacked batch needs one shape per field: pipeline.batch_format = 'list' takes fields of "
                "varying shape, or a mapper can crop or pad them"
            )
        if mapped:
            warnings.append(f"{dataset}: {mismatch.text} (the mappers must make them agree: {fix})")
        else:
            errors.append(f"{dataset}: {mismatch.text}: {fix}")
    samples, size = found.samples, pipeline.batch_size
    if pipeline.drop_last and samples is not None and 0 < samples < size:  # mappers never add samples
        errors.append(
            f"{dataset}: batch_size {size} > {samples} samples with drop_last: every epoch is empty "
            "(lower pipeline.batch_size, or set pipeline.drop_last = false)"
        )


def _judge_dtypes(view: Any, dataset: str, found: Any, errors: list[str], warnings: list[str]) -> None:
    """What the survey does not compare (strings, bytes and void dtypes) but an epoch refuses: a zero-width
    (``|V0``) or structured dtype, and a string field in one file beside numbers in another (stacked batches).
    The summary only hints at them (the dtype itself, or "varies" with no dtype mismatch): the files are then
    surveyed one at a time, to name the first that has it."""
    from loader.io.survey import VARIES

    reported = {m.text.split(" has ")[0] for m in found.mismatches if m.kind == "dtype"}
    stacked = view.pipeline.batch_format == "stacked"
    # A reader's samples are read again by a second survey (strings of many lengths "vary" too): built-in
    # formats only, whose survey reads headers and blocks.
    compare = stacked and view.source.reader is None
    suspects = [
        f.name
        for f in found.fields
        if _refused_dtype(f.dtype) or (compare and f.dtype == VARIES and f"field {f.name!r}" not in reported)
    ]
    if not suspects or view.source.provider is not None:
        return
    # Where only "varies" made a field suspect, the files whose dtypes a survey reads from a header: a text or
    # RecordIO file surveyed again is parsed whole (it doubled check's time), and its strings vary within it.
    headers_only = not any(_refused_dtype(f.dtype) for f in found.fields if f.name in suspects)
    line = _first_odd_dtype(view.source, suspects, stacked, headers_only)
    if line is not None:
        mapped = bool(view.pipeline.mappers or view.pipeline.batch_mappers)
        (warnings if mapped else errors).append(f"{dataset}: {line}{' (the mappers must change it)' if mapped else ''}")


def _first_odd_dtype(source: Any, names: list[str], stacked: bool, headers_only: bool) -> str | None:
    """What is wrong with the first file (of ``source``) whose field among ``names`` has a dtype an epoch refuses;
    ``headers_only``: only the files read as ``.npy``/``.npz``."""
    from loader.io.survey import VARIES, shown, survey

    first: dict[str, tuple[str, np.dtype]] = {}  # field -> the first file's (path, dtype) of a plain dtype
    for path in source.expand_files():
        if headers_only and (source.format or os.path.splitext(path)[1][1:].lower()) not in ("npy", "npz"):
            continue
        for summary in survey(_OneFile(source, path)).fields:
            if summary.name not in names or summary.dtype == VARIES:
                continue
            dtype = _dtype_of(summary.dtype)
            reason = _refused_dtype(summary.dtype)
            if reason is not None:
                return f"field {summary.name!r} in {shown(path)} {reason}"
            if dtype is None or not stacked:
                continue
            was = first.setdefault(summary.name, (path, dtype))
            text = (was[1].kind in "USV", dtype.kind in "USV")
            # Text beside numbers: no batch stacks both; text of two widths (<U2, <U3): the stage refuses it too.
            if text[0] != text[1] or (any(text) and was[1] != dtype):
                return (
                    f"field {summary.name!r} has dtype {was[1]} in {shown(was[0])} but {dtype} in {shown(path)}: "
                    f"{ONE_DTYPE_FIX}"
                )
    return None


class _OneFile:
    """``source`` narrowed to one of its files, for ``survey``."""

    def __init__(self, source: Any, path: str) -> None:
        self._source, self._path = source, path

    def expand_files(self) -> list[str]:
        return [self._path]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


def _dtype_of(text: str) -> np.dtype | None:
    """The dtype the survey shows as ``text`` (``str(dtype)``: a structured one as its list of fields)."""
    import ast

    try:
        return np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        pass
    try:
        return np.dtype(ast.literal_eval(text))
    except (TypeError, ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _refused_dtype(text: str) -> str | None:
    """Why no epoch takes a field of the dtype shown as ``text`` (zero-width or structured), else None."""
    from workers.sample_check import unsendable_dtype

    dtype = _dtype_of(text)
    if dtype is None or dtype.hasobject:  # objects are Python values of a reader: a list batch takes them
        return None
    return unsendable_dtype(dtype)


def _why_empty(pipeline: Any) -> str:
    """Why a dataset with samples gave no first batch (its samples were counted: none were wanting)."""
    causes = []
    if pipeline.drop_last:
        causes.append(f"fewer samples than batch_size {pipeline.batch_size} with drop_last")
    if pipeline.on_error == "skip":
        causes.append("on_error = 'skip' skipped every record")
    return " or ".join(causes) or "no sample reached a batch"


def _why_no_samples(path: str) -> str:
    """The likely cause of a file without samples."""
    try:
        size = os.path.getsize(path)
    except OSError:  # pragma: no cover - gone since it was read
        size = -1
    if size == 0 and path.endswith(".recordio"):
        return "0 bytes: a RecordIO writer that was never closed? Records reach the file when it closes"
    return "0 bytes: an empty file" if size == 0 else "no records"


def _read_first_batches(config: Any, into: dict[str, Any], field_names: dict[str, list[str]]) -> None:
    """Each dataset's first batch of epoch 0 described (or None when empty) into ``into``, in order; the fields
    of a list of tuples (``batch_format = "list"``) named by ``field_names`` (the survey's, per dataset)."""
    from loader.service.first_batch import describe_batch, first_batch_reader

    with first_batch_reader(config) as first_batch:
        for name in config.dataset_names:
            batch = first_batch(name)
            if batch is None:
                into[name] = None
                continue
            count, rows = describe_batch(batch)
            if isinstance(batch, list) and batch and not isinstance(batch[0], dict):
                rows = _named_positions(rows, field_names.get(name, []))
            into[name] = (count, rows)


def cmd_gen_data(args: argparse.Namespace) -> int:
    from loader.examples.datagen import earlier_parts, generate

    paths = generate(args.dir, format=args.format, files=args.files, samples=args.samples, dim=args.dim, seed=args.seed)
    print(f"wrote {len(paths)} {args.format} files of {args.samples} samples (dim {args.dim}) to {args.dir}")
    _warn_of_earlier_parts(args.dir, earlier_parts(args.dir, paths))
    return EXIT_OK


def _warn_of_earlier_parts(directory: str, left: list[str]) -> None:
    """One warning line for the part files an earlier ``gen-data`` run of more files (or another format) left in
    ``directory``: a config's glob reads them too, and ``loader check`` then fails on their shape, or they are
    served without a word. Said, never deleted (they may be the user's)."""
    if not left:
        return
    shown = ", ".join(left[:2]) + (", ..." if len(left) > 2 else "")
    print(
        f"loader: warning: {directory} still holds {_count(len(left), 'part file')} of an earlier run ({shown}), "
        "which a glob such as part-* reads too: remove them, or write into an empty directory",
        file=sys.stderr,
    )


def _load_checked(path: str, options: dict[str, Any], assignments: list[str] | None = None) -> Any:
    """Load a config with the environment's and the command line's values over it (``--set``, then
    ``options`` such as ``--workers``), and fail now on bad imports or files."""
    from loader.config import load_config
    from loader.config.overrides import Override, from_assignment

    flags = {"service.bind": "--bind", "workers.count": "--workers"}
    given = [
        Override(key, value, f"{flags.get(key, key)} {value}") for key, value in options.items() if value is not None
    ]
    config = load_config(path, overrides=[*(from_assignment(a) for a in assignments or ()), *given])
    config.check_imports()
    for name in config.dataset_names:  # a missing file or empty list is reported before binding a port
        config.dataset(name).expand_files()
    return config


class _stop_on_signals:  # used like a function: with _stop_on_signals(stop): ...
    """SIGINT/SIGTERM set ``stop`` (a clean, bounded shutdown); a second signal interrupts at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    # A SIGTERM sent to the daemon and to its process group (``timeout``, some supervisors) arrives twice at
    # once: the same signal this soon after the first is that one stop, not an operator insisting.
    REPEAT_S = 1.0

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.previous: dict[int, Any] = {}
        self.first: tuple[int, float] | None = None  # the signal that began the stop, and when

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.stop.is_set():
            repeat = self.first is not None and self.first[0] == signum and now - self.first[1] < self.REPEAT_S
            if repeat and signum == signal.SIGTERM:  # a second Ctrl-C is a keypress: it insists, however soon
                return
            raise KeyboardInterrupt  # the user insists: leave now (resources still close in finally)
        log.info("received %s, stopping", signal.Signals(signum).name)
        self.first = (signum, now)
        self.stop.set()

    def __enter__(self) -> _stop_on_signals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def format_status(status: dict[str, Any]) -> str:
    """A daemon's status dict as text: scalars as ``key: value``, lists of dicts as tables.

    Peers name themselves (a client's job, a worker's id): their control characters are shown escaped, so
    none can clear the operator's screen, set the terminal's title or print a line of its own."""
    return "\n".join(_CONTROL.sub(_escaped, line) for line in _status_lines(status, indent=""))


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escaped(found: re.Match[str]) -> str:
    return repr(found.group())[1:-1]


def _status_lines(mapping: dict[str, Any], indent: str) -> Iterator[str]:
    scalars = {k: v for k, v in mapping.items() if not isinstance(v, (dict, list))}
    width = max((len(str(k)) for k in scalars), default=0)
    for key, value in scalars.items():
        yield f"{indent}{str(key) + ':':<{width + 1}} {_fmt(value)}"
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield f"{indent}{key}:"
            yield from _status_lines(value, indent + "  ")
        elif isinstance(value, list):
            yield f"{indent}{key}: {'(none)' if not value else ''}".rstrip()
            yield from _table(value, indent + "  ")


# What one table shows (``loader status --json`` shows everything). A table had one column per key of any
# row: a peer's 10,000 rows with a key each took 44 s and 1.3 GB to print. A daemon's rows share their keys
# (clients, the widest, have 13) and it has a row per worker and per client.
MAX_TABLE_ROWS = 1000
MAX_TABLE_COLUMNS = 24


def _table(rows: list[Any], indent: str) -> Iterator[str]:
    """``rows`` (dicts) as a table, its columns the keys in order of first appearance (a daemon's rows
    all have its keys, in its order); at most ``MAX_TABLE_ROWS`` rows and ``MAX_TABLE_COLUMNS`` columns,
    the rest counted in a last line. Other items are listed on one line, as many."""
    if not rows:
        return
    shown = rows[:MAX_TABLE_ROWS]
    rows_left = len(rows) - len(shown)
    if not all(isinstance(row, dict) for row in shown):
        more = f", ... {rows_left} more" if rows_left else ""
        yield f"{indent}{', '.join(_fmt(row) for row in shown)}{more}"
        return
    keys = dict.fromkeys(key for row in shown for key in row)  # linear in the keys of the rows shown
    columns = list(itertools.islice(keys, MAX_TABLE_COLUMNS))
    fields_left = len(keys) - len(columns)
    cells = [[_fmt(row.get(col, "")) for col in columns] for row in shown]
    widths = [max(len(str(col)), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    yield indent + "  ".join(str(col).upper().ljust(w) for col, w in zip(columns, widths)).rstrip()
    for row in cells:
        yield indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
    left = [_count(rows_left, "more row"), _count(fields_left, "more field")]
    if rows_left or fields_left:
        yield f"{indent}... {', '.join(part for part in left if part)} (--json shows them)"


def _count(n: int, what: str) -> str:
    return "" if not n else f"{n} {what}{'s' if n != 1 else ''}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return "-" if value is None else str(value)


class _VersionAction(argparse.Action):
    """``--version``: looks the version up only when asked (the lookup costs every command 20-30 ms)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        print(f"loader {loader.__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    common.add_argument(
        "--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"], help="(default: info)"
    )
    parser = argparse.ArgumentParser(
        prog="loader", description="A data-loading service for ML training.", parents=[common]
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common])
        p.set_defaults(func=func)
        return p

    p = add("serve", cmd_serve, "run the loader daemon in the foreground (Ctrl-C or SIGTERM stops it)")
    p.add_argument("config", metavar="CONFIG", help="a TOML config (see configs/example.toml)")
    p.add_argument("--bind", metavar="ADDR", help="listen here instead of service.bind, e.g. tcp://0.0.0.0:5555")
    p.add_argument("--workers", metavar="N", type=int, help="worker processes (instead of workers.count)")
    p.add_argument(
        "--address-file",
        metavar="PATH",
        help="write the bound address here (for a bind to port *), removed on exit; trainers read it as LOADER_ADDRESS",
    )
    _add_set(p)

    p = add("status", cmd_status, "show a running daemon's workers, files, throughput and clients")
    p.add_argument(
        "address",
        metavar="ADDRESS",
        nargs="?",
        help="the daemon: tcp://HOST:PORT, HOST:PORT, ipc://PATH, or a config file (its service.bind); "
        "default LOADER_ADDRESS, else tcp://127.0.0.1:5555, the default bind",
    )
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.add_argument(
        "--timeout",
        type=float,
        default=STATUS_TIMEOUT_S,
        metavar="S",
        help="seconds to wait, > 0 and at most a week (default 5)",
    )
    p.add_argument(
        "--watch",
        nargs="?",  # a string: `--watch ADDRESS` takes the address as its value (see _watch_interval)
        const=str(WATCH_INTERVAL_S),
        metavar="S",
        help=f"refresh in place every S seconds (default {WATCH_INTERVAL_S:g}, at least {WATCH_MIN_S:g}) until Ctrl-C",
    )

    p = add("worker", cmd_worker, "run one worker that serves the daemon at --connect")
    p.add_argument(
        "--connect",
        required=True,
        metavar="ADDR",
        help="the daemon: tcp://HOST:PORT, HOST:PORT, ipc://PATH, or a config file (its service.bind)",
    )
    p.add_argument("--id", default=None, metavar="NAME", help="a name for this worker (default: chosen by the daemon)")
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="give up when no daemon answers within S seconds (default 30)",
    )

    p.add_argument("--key", metavar="FILE", help="this worker's CURVE secret key file (or LOADER_PEER_KEY)")
    p.add_argument("--config", metavar="CONFIG", help="take --key and --daemon-public-key from its [service]")
    p.add_argument(
        "--daemon-public-key", metavar="FILE", help="the daemon's CURVE public key file (or LOADER_DAEMON_PUBLIC_KEY)"
    )

    p = add("keys", cmd_keys, "create CURVE key pairs: the daemon's, and one per peer it admits (docs/security.md)")
    p.add_argument("dir", metavar="DIR", help="where to write them (created, owner-only)")
    p.add_argument("--peer", action="append", metavar="NAME", help="a peer's name (repeatable; default worker, client)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the daemon's pair and the named peers' pairs when they exist (by default existing pairs are "
        "kept and only missing ones are made: a new daemon pair locks out every peer holding the old daemon.key)",
    )

    p = add(
        "check",
        cmd_check,
        "validate a config (keys, values, imports, files), count samples per field, read each dataset's first batch, "
        "say where each value came from",
    )
    p.add_argument("config", metavar="CONFIG", help="a TOML config (see configs/example.toml)")
    p.add_argument(
        "--no-batch",
        action="store_true",
        help="do not read each dataset's first batch (which starts one worker and runs the mappers)",
    )
    _add_set(p)

    p = add("gen-data", cmd_gen_data, "write a synthetic dataset (features + integer labels)")
    p.add_argument("dir", metavar="DIR", help="the directory to write part-XXXXX files into (created)")
    p.add_argument(
        "--format",
        choices=["npy", "npz", "recordio"],
        default="npy",
        help="npy: part-N.npy features + part-N.label.npy labels; npz: keys x and label; "
        "recordio: records [features, label] (default npy)",
    )
    p.add_argument("--files", type=int, default=4, metavar="N", help="files to write (default 4)")
    p.add_argument("--samples", type=int, default=1024, metavar="M", help="samples per file (default 1024)")
    p.add_argument("--dim", type=int, default=64, help="float32 features per sample (default 64)")
    p.add_argument("--seed", type=int, default=0, help="the values are a function of the seed (default 0)")

    from loader.recordio.paddle_convert import add_command as add_recordio_command  # its logic lives there

    add_recordio_command(add)
    return parser


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable; VALUE is read as TOML), e.g. --set pipeline.batch_size=64; "
        "LOADER_SECTION__KEY environment variables do the same, below --set",
    )


def _error_line(exc: BaseException) -> str:
    text = exc._summary() if isinstance(exc, WorkerError) else str(exc)  # no remote traceback here
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    # Where a reader met it (a text format's "while parsing line 5 of a.txt"): the note is the where.
    for note in getattr(exc, "__notes__", None) or ():
        note = str(note).strip()
        text = f"{text} {note if note.startswith('(') else f'({note})'}"
    return " ".join(text.split()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    debug = getattr(args, "debug", False)
    level = "debug" if debug else getattr(args, "log_level", "info")
    logging.basicConfig(
        stream=sys.stderr, level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader of our output left (``loader status --json | head``): not an error. Point stdout
        # at /dev/null so the interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("loader: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (LoaderError, OSError, ValueError) as exc:
        if debug:
            raise
        print(f"loader: error: {_error_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # the top of the program: one line, not a traceback
        if debug:
            raise
        print(
            f"loader: error: unexpected {type(exc).__name__}: {_error_line(exc)} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
