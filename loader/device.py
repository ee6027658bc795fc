"""Placement of batches on a device: the one module that knows about torch and cupy.

Contract used by ``DoubleBufferReader``, ``DataFeeder`` and the service client::

    placer = Placer("cpu")          # or "cuda:0", "cuda", "torch:cpu", torch.device("cuda", 1)
    staged = placer.stage(batch)    # background thread: start the host->device copy
    batch = placer.finish(staged)   # consumer thread: wait for that copy, get the result
    batch = placer.place_now(batch) # both steps at once, on the calling thread

``batch`` is any nest of lists, tuples, dicts and dataclass instances (e.g.
``loader.LoDTensor``) whose leaves are numpy arrays; numpy scalars (a sample's scalar fields in a
``batch_format = "list"`` batch) are placed as 0-d arrays; other leaves pass through.

Places:

* ``"cpu"``: numpy, both steps return the input unchanged.
* ``"torch"`` or ``"torch:cpu"``: ``torch.Tensor`` on the CPU sharing memory with the arrays where possible.
* ``"cuda"``, ``"cuda:N"``, ``"gpu:N"`` or a ``torch.device``: torch tensors on that device when
  torch is installed, else cupy arrays. ``"torch:cuda:N"`` / ``"cupy:cuda:N"`` pick the library.

A CUDA place that names no device (``"cuda"``, ``"gpu"``, ``"torch:cuda"``, ``torch.device("cuda")``)
is the current device of the thread that makes the ``Placer``: ``torch.cuda.current_device()`` (what
torch itself reads ``torch.device("cuda")`` as, so ``torch.cuda.set_device(local_rank)`` before is
honoured), or cupy's current device with cupy. It is read once, at construction: the copies run on
other threads, whose current device is not the caller's. A ``Client`` first makes such a place
``cuda:LOCAL_RANK`` where ``LOCAL_RANK`` (or ``SLURM_LOCALID``) is set (``loader.service.client.env``).

On a CUDA place ``stage`` copies each array into pinned host memory, issues an
asynchronous copy on this placer's side stream and records an event; it does not
wait for the copy. ``finish`` makes the consumer's current stream wait on that
event (a GPU-side wait: the host is not blocked) and tells the caching allocator
that the consumer stream now uses the memory. Leaves whose dtype the library
cannot hold stay numpy arrays, on every place other than ``"cpu"``: strings, objects, datetimes and
timedeltas, and ``np.longdouble`` / ``np.clongdouble`` (float128 / complex256: neither torch nor cupy has
an extended-precision type; cast such a field to float64 in a mapper to get tensors). Which numeric
dtypes torch takes is asked of the installed torch (``torch.from_numpy``, once per dtype and placer): older
torch versions have no uint16/uint32/uint64 tensors, so there those stay numpy too. A leaf that stays numpy
is never an error: the batch arrives with that field as the numpy array it was read as.

Fluid's place objects are taken too: ``CPUPlace()`` and ``CUDAPinnedPlace()`` are ``"cpu"``,
``CUDAPlace(i)`` is ``"cuda:i"``, and None (fluid's default) is ``"cpu"``.

torch and cupy are imported lazily, inside the functions that need them, so the
package imports and runs on the CPU without either. A place that cannot be parsed,
a CUDA place without torch or cupy, or without that device, raises ``ConfigError`` (a ``ValueError``) at
construction; ``"torch"``/``"torch:cpu"`` without torch raises ``MissingDependencyError``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from loader.errors import ConfigError, MissingDependencyError

# What a place may be (as ``config.sections.DEVICE_FORMS`` says of client.device, plus torch.device objects).
PLACE_FORMS = (
    "'cpu', 'torch', 'torch:cpu', 'cuda', 'cuda:N', 'gpu' or 'gpu:N' (a GPU form may be prefixed with 'torch:' "
    "or 'cupy:'), or a torch.device"
)
_PLACE_RE = re.compile(r"^(?:(torch|cupy):)?(cpu|cuda|gpu)(?::(\d+))?$")
# Pinned buffers handed to cupy's asynchronous copy are kept alive until their event
# has completed; this bounds how many finished ones are checked per finish() call.
_MAX_PENDING_CHECK = 64


def _try_import(name: str) -> Any:
    """The module ``name``, or None when it is not installed; ``MissingDependencyError`` with the import's own
    words when it is installed but does not import (a missing CUDA library, a script named like a module
    it imports): "not installed, pip install torch" sent users to reinstall what was there."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        error: ImportError = exc
    except ImportError as exc:
        error = exc
    raise MissingDependencyError(f"{name} is installed but does not import: {type(error).__name__}: {error}")


def import_torch(needed_by: str) -> Any:
    """The ``torch`` module, or ``MissingDependencyError`` saying that ``needed_by`` needs it and how to install it."""
    torch = _try_import("torch")
    if torch is None:
        raise MissingDependencyError(f"{needed_by} needs PyTorch, which is not installed: pip install torch")
    return torch


def place_name(place: Any) -> Any:
    """A fluid place object (``CPUPlace()``, ``CUDAPinnedPlace()``, ``CUDAPlace(i)``) or None (fluid's
    "no place": the host) as a place string; anything else as given."""
    if place is None:
        return "cpu"
    kind = type(place).__name__
    if kind in ("CPUPlace", "CUDAPinnedPlace"):
        return "cpu"
    if kind in ("CUDAPlace", "GPUPlace"):
        index = place.get_device_id() if hasattr(place, "get_device_id") else getattr(place, "device_id", 0)
        return f"cuda:{int(index)}"
    return place


def _parse_place(place: Any) -> tuple[str, str, int | None]:
    """(library, kind, device index): library in {numpy, torch, cupy, auto}, kind in {cpu, cuda}; the index
    is None for a CUDA place that names no device (resolved by ``_check_cuda_library``), 0 on the CPU."""
    # Fluid's place objects everywhere a place is taken (DoubleBufferReader, Client), not only in DataFeeder:
    # paddle code passes CPUPlace(), CUDAPlace(0) or double_buffer's default None.
    place = place_name(place)
    if type(place).__module__.startswith("torch") and hasattr(place, "type"):
        library, kind = "torch", str(place.type)
        if kind not in ("cpu", "cuda"):
            raise ConfigError(f"unsupported place {place!r}: only cpu and cuda devices are supported")
        if kind == "cpu":
            return library, kind, 0
        return library, kind, None if place.index is None else int(place.index)
    if not isinstance(place, str):
        raise ConfigError(f"unsupported place {place!r}: use {PLACE_FORMS}")
    text = place.strip().lower()
    if text in ("torch", "cupy"):  # the library alone: torch tensors on the CPU (cupy has no CPU place)
        text += ":cpu"
    match = _PLACE_RE.match(text)
    if match is None:
        raise ConfigError(f"unsupported place {place!r}: use {PLACE_FORMS}")
    library, kind = match.group(1), match.group(2)
    index = None if match.group(3) is None else int(match.group(3))
    kind = "cuda" if kind == "gpu" else kind
    if kind == "cpu":
        if match.group(3) is not None:
            raise ConfigError(f"unsupported place {place!r}: a cpu place takes no device index")
        return (library or "numpy"), "cpu", 0
    return (library or "auto"), "cuda", index


def cuda_without_index(place: Any) -> str | None:
    """``"cuda"``, ``"torch:cuda"`` or ``"cupy:cuda"`` for a CUDA place that names no device (``"gpu"``,
    ``torch.device("cuda")``, ...), to which ``":N"`` can be appended; None for any other place (an
    unparseable one included: ``Placer`` says what is wrong with it)."""
    try:
        library, kind, index = _parse_place(place)
    except ValueError:
        return None
    if kind != "cuda" or index is not None:
        return None
    return "cuda" if library == "auto" else f"{library}:cuda"


def _check_cuda_library(library: str, index: int | None, text: str) -> tuple[str, int]:
    """(library, index): resolve 'auto' and a missing index (the calling thread's current device), and
    check that the library sees CUDA device ``index``."""
    candidates = ["torch", "cupy"] if library == "auto" else [library]
    for name in candidates:
        module = _try_import(name)
        if module is None:
            continue
        if name == "torch":
            count = module.cuda.device_count() if module.cuda.is_available() else 0
            if index is None and count:
                index = int(module.cuda.current_device())  # what torch reads torch.device("cuda") as
        else:
            try:
                count = module.cuda.runtime.getDeviceCount()
            except Exception:  # cupy raises its own runtime error without a driver
                count = 0
            if index is None and count:
                index = int(module.cuda.runtime.getDevice())
        if index is None:
            index = 0  # no device at all: said as "no device 0" below
        if index >= count:
            raise ConfigError(f"place {text!r}: {name} sees {count} CUDA device(s), no device {index}")
        return name, index
    wanted = " or ".join(candidates)
    raise ConfigError(f"place {text!r} needs {wanted} installed for device placement; only 'cpu' is available")


def map_leaves(obj: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    """Apply ``fn`` to every numpy array in a nest of lists, tuples, dicts and dataclasses; a numpy scalar is
    given to ``fn`` as a 0-d array, and stays the scalar it was where ``fn`` returns that array unchanged."""
    if isinstance(obj, np.ndarray):
        return fn(obj)
    if isinstance(obj, np.generic):
        # A sample's label in a batch_format = "list" batch is np.int64(3), not an array: it stayed numpy (and on
        # the host, with device="cuda") while the sample's arrays beside it became tensors.
        array = np.asarray(obj)
        placed = fn(array)
        return obj if placed is array else placed
    if isinstance(obj, dict):
        return type(obj)((key, map_leaves(value, fn)) for key, value in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_leaves(value, fn) for value in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_leaves(value, fn) for value in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_leaves(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def _host_array(array: np.ndarray) -> np.ndarray:
    # torch.from_numpy refuses byte-swapped arrays (e.g. rows of a big-endian .npy file)
    # and read-only ones, and warns on non-contiguous ones.
    if not array.dtype.isnative:
        return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)
    if not array.flags.c_contiguous or not array.flags.writeable:
        return np.array(array, order="C", copy=True)
    return array


def _device_storable(array: np.ndarray, library: str, torch_holds: Callable[[np.dtype], bool]) -> bool:
    """Whether ``library`` has a type for ``array``'s dtype; if not, the leaf stays numpy (module docstring)."""
    dtype = array.dtype
    if dtype.kind not in "biufc":  # strings, objects, datetimes, structured
        return False
    if library == "torch":
        return torch_holds(dtype)
    return dtype.char not in "gG"  # cupy: every bool, int, float and complex but long double (float128, complex256)


def _pinned_copy(torch: Any, array: np.ndarray) -> Any:
    """A pinned host tensor holding ``array``'s values: one numpy copy on the calling thread.

    Not ``Tensor.pin_memory()``: its copy runs on torch's intra-op thread pool (one
    thread per core), fast on idle cores but slow when the loader's own processes keep
    them busy, which is exactly when staging is on the critical path. Measured on a
    16-core H100 host, 16 MiB batches through ``Client(device="cuda")`` with a consumer
    that waits on data: ``stage`` took 3.0-4.8 ms per batch with ``pin_memory()`` and
    1.7-1.9 ms with this copy, and the epoch went from 8.4-9.7 to 4.9-7.5 ms per batch
    (``scripts/gpu_check.py --profile``, several runs each). ``np.copyto`` also takes read-only, strided and
    byte-swapped arrays as they are, so each is copied once.
    """
    native = array.dtype.newbyteorder("=")
    dtype = torch.from_numpy(np.empty(0, dtype=native)).dtype
    pinned = torch.empty(array.shape, dtype=dtype, pin_memory=True)
    np.copyto(pinned.numpy(), array, casting="equiv")  # "equiv": a byte order change, nothing else
    return pinned


def _pinned_view(torch: Any, array: np.ndarray, handed_out: Callable[[Any], bool]) -> Any:
    """``array`` as a view of the page-locked tensor ``Placer.host_buffer`` gave its memory from, or None.

    Only memory ``host_buffer`` handed out (``handed_out``): an array in pinned memory of the
    caller's own is copied, as ``stage`` always did, so the caller may overwrite it once staged.
    The view is of torch's own pinned tensor, not ``torch.from_numpy``: torch's pinned-memory
    cache records the copy's stream on that tensor's memory, so a later ``host_buffer`` is not
    handed the same bytes while the device still reads them.
    """
    if array.nbytes == 0 or not array.flags.c_contiguous or not array.dtype.isnative:
        return None
    owner: Any = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    if not handed_out(owner):
        return None
    try:
        offset = array.ctypes.data - owner.data_ptr()
        if offset < 0 or offset + array.nbytes > owner.numel():
            return None
        dtype = torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
        return owner[offset : offset + array.nbytes].view(dtype).view(array.shape)
    except (RuntimeError, TypeError, ValueError):
        return None  # a dtype torch views differently: the copy path takes it


class _Staged:
    """What ``stage`` returns on a CUDA place: the placed nest and the copy's event."""

    __slots__ = ("value", "event", "host")

    def __init__(self, value: Any, event: Any, host: list[Any]) -> None:
        self.value, self.event, self.host = value, event, host


class Placer:
    """Moves nests of numpy arrays to one place (see the module docstring)."""

    def __init__(self, place: Any = "cpu") -> None:
        library, kind, where = _parse_place(place)
        index = 0
        if kind == "cuda":
            library, index = _check_cuda_library(library, where, str(place))
        elif library == "torch" and _try_import("torch") is None:
            raise MissingDependencyError(
                f"place {place!r} needs torch: pip install torch (or use 'cpu' for numpy arrays)"
            )
        elif library == "cupy":
            raise ConfigError(f"unsupported place {place!r}: cupy arrays live on a CUDA device, use 'cupy:cuda:N'")
        self.library, self.kind, self.index = library, kind, index
        self.place = "cpu" if library == "numpy" else (f"{library}:cpu" if kind == "cpu" else f"cuda:{index}")
        self._lock = threading.Lock()
        self._torch_holds: dict[tuple[str, str], bool] = {}  # native dtype (char, str) -> torch.from_numpy takes it
        self._stream: Any = None
        self._pending: deque[tuple[Any, list[Any]]] = deque()
        # The tensors host_buffer handed out, by id, held weakly (a torch.Tensor compares elementwise, so no WeakSet).
        self._host_buffers: dict[int, weakref.ref[Any]] = {}

    def __repr__(self) -> str:
        return f"Placer({self.place!r}, library={self.library!r})"

    @property
    def is_cpu(self) -> bool:
        """True when arrays stay numpy arrays in host memory."""
        return self.library == "numpy"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def gathers_pinned(self) -> bool:
        """Whether ``host_buffer`` gives page-locked memory that ``stage`` sends to the device as it lies."""
        return self.library == "torch" and self.kind == "cuda"

    def host_buffer(self, nbytes: int) -> np.ndarray | None:
        """A writable, uninitialised ``uint8`` array of ``nbytes`` in page-locked memory, for rows on their way
        to this torch CUDA place; None on any other place, or where the host refuses more pinned memory.

        ``stage`` copies a batch gathered into it to the device as it lies, without first copying it
        into pinned memory of its own: one host copy of each batch instead of two.
        """
        if not self.gathers_pinned:
            return None
        torch = importlib.import_module("torch")
        try:
            # On this place's device: the receiver thread's current device is 0 until set, and torch's pinned
            # allocator works in the current device's context, so a rank on cuda:3 that had done no CUDA work
            # yet would get a context on GPU 0 (stage's copies already ran under this guard).
            with torch.cuda.device(self.index):
                array = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
        except RuntimeError:
            return None  # page-locked memory refused (the host's limit): the caller gathers into its own
        owner, key = array.base, id(array.base)
        self._host_buffers[key] = weakref.ref(owner, self._forget(key))
        return array

    def _forget(self, key: int) -> Callable[[Any], None]:
        """What drops ``key`` from ``_host_buffers`` once its tensor is gone (before its id can be reused)."""
        buffers = self._host_buffers  # not self: the callback must not keep the placer alive

        def forget(_gone: Any) -> None:
            buffers.pop(key, None)

        return forget

    def _handed_out(self, owner: Any) -> bool:
        ref = self._host_buffers.get(id(owner))
        return ref is not None and ref() is owner

    def place_now(self, obj: Any) -> Any:
        """``finish(stage(obj))`` on the calling thread."""
        return self.finish(self.stage(obj))

    def stage(self, obj: Any) -> Any:
        """Start moving ``obj``; call from the producer (background) thread."""
        if self.library == "numpy":
            return obj
        if self.kind == "cpu":
            torch = importlib.import_module("torch")
            return map_leaves(obj, lambda a: torch.from_numpy(_host_array(a)) if self._storable(a) else a)
        if self.library == "torch":
            return self._stage_torch(obj)
        return self._stage_cupy(obj)

    def finish(self, staged: Any) -> Any:
        """Make the consumer's stream wait for the copy; call from the consumer thread."""
        if not isinstance(staged, _Staged):
            return staged
        if self.library == "torch":
            return self._finish_torch(staged)
        return self._finish_cupy(staged)

    def _storable(self, array: np.ndarray) -> bool:
        return _device_storable(array, self.library, self._torch_has)

    def _torch_has(self, dtype: np.dtype) -> bool:
        """Whether ``torch.from_numpy`` takes ``dtype`` (asked once per dtype): torch has no long double, and
        older versions no uint16/32/64; one refused leaf raised in the client's receiver thread, which
        killed the client."""
        native = dtype.newbyteorder("=")
        key = (native.char, native.str)  # the char too: long double is '<f8' where it is no wider than double
        known = self._torch_holds.get(key)
        if known is None:
            torch = importlib.import_module("torch")
            try:
                torch.from_numpy(np.empty(0, dtype=native))
                known = True
            except (TypeError, ValueError):
                known = False
            self._torch_holds[key] = known
        return known

    # -- torch -------------------------------------------------------------------------

    def _side_stream(self, make: Callable[[], Any]) -> Any:
        with self._lock:
            if self._stream is None:
                self._stream = make()
            return self._stream

    def _stage_torch(self, obj: Any) -> _Staged:
        torch = importlib.import_module("torch")
        device = torch.device("cuda", self.index)
        stream = self._side_stream(lambda: torch.cuda.Stream(device=device))
        host: list[Any] = []

        def copy(array: np.ndarray) -> Any:
            if not self._storable(array):
                return array
            pinned = _pinned_view(torch, array, self._handed_out)
            if pinned is None:
                pinned = _pinned_copy(torch, array)
            host.append(pinned)
            return pinned.to(device, non_blocking=True)

        with torch.cuda.device(device), torch.cuda.stream(stream):
            value = map_leaves(obj, copy)
            event = torch.cuda.Event()
            event.record(stream)
        return _Staged(value, event, host)

    def _finish_torch(self, staged: _Staged) -> Any:
        torch = importlib.import_module("torch")
        device = torch.device("cuda", self.index)
        consumer = torch.cuda.current_stream(device)
        consumer.wait_event(staged.event)

        def mark(tensor: Any) -> Any:
            # The tensors were allocated on the side stream; without this the caching
            # allocator could hand their memory out again while the consumer still reads it.
            if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                tensor.record_stream(consumer)
            return tensor

        _walk(staged.value, mark)
        return staged.value

    # -- cupy --------------------------------------------------------------------------

    def _stage_cupy(self, obj: Any) -> _Staged:
        cupy = importlib.import_module("cupy")
        cupyx = importlib.import_module("cupyx")
        host: list[Any] = []
        with cupy.cuda.Device(self.index):
            stream = self._side_stream(lambda: cupy.cuda.Stream(non_blocking=True))

            def copy(array: np.ndarray) -> Any:
                if not self._storable(array):
                    return array
                pinned = cupyx.empty_pinned(array.shape, array.dtype)
                pinned[...] = array
                host.append(pinned)
                out = cupy.empty(array.shape, array.dtype)
                out.set(pinned, stream=stream)
                return out

            value = map_leaves(obj, copy)
            event = stream.record()
        return _Staged(value, event, host)

    def _finish_cupy(self, staged: _Staged) -> Any:
        cupy = importlib.import_module("cupy")
        with cupy.cuda.Device(self.index):
            cupy.cuda.get_current_stream().wait_event(staged.event)
        # cupy's pinned pool may reuse a buffer as soon as it is freed, so keep each
        # one until its copy has completed (checked without blocking).
        with self._lock:
            self._pending.append((staged.event, staged.host))
            for _ in range(min(len(self._pending), _MAX_PENDING_CHECK)):
                event, _host = self._pending[0]
                if not event.done:
                    break
                self._pending.popleft()
        return staged.value


def _walk(obj: Any, fn: Callable[[Any], Any]) -> None:
    """Call ``fn`` on every leaf of a nest (like ``map_leaves`` but for any leaf)."""
    if isinstance(obj, dict):
        for value in obj.values():
            _walk(value, fn)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _walk(value, fn)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name), fn)
    else:
        fn(obj)


def device_count(place: Any) -> int:
    """How many devices of ``place``'s kind exist (CPU places count as one)."""
    placer = place if isinstance(place, Placer) else Placer(place)
    if not placer.is_cuda:
        return 1
    if placer.library == "torch":
        return int(importlib.import_module("torch").cuda.device_count())
    return int(importlib.import_module("cupy").cuda.runtime.getDeviceCount())


__all__ = ["Placer", "map_leaves", "device_count", "import_torch", "cuda_without_index"]
