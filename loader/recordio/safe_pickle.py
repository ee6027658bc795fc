"""A restricted unpickler for the pickled records of PaddlePaddle's RecordIO files.

Paddle's readers stored each sample as ``pickle.dumps(sample)``. Unpickling runs whatever
the bytes name, so nothing here unpickles unless the user opted in (``allow_pickle=True``),
and then only through :func:`loads`, which admits exactly:

* numbers, strings, bytes, ``None``, booleans, lists, tuples and dicts (built by pickle's own
  opcodes, no class involved, except ``complex``; ``bytes`` pickled by protocols 0-2 go through
  ``_codecs.encode(text, "latin1")``, which is admitted for that encoding only);
* numpy arrays (``numpy.core.multiarray._reconstruct`` for ``numpy.ndarray`` itself, and
  protocol 5's ``numpy.core.numeric._frombuffer``), numpy dtypes and numpy scalars, of any
  dtype that does not hold Python objects.

Any other global is refused by name before it is looked up: ``os.system``, ``builtins.eval``,
``copyreg._reconstructor``, a subclass of ``ndarray`` (``numpy.memmap``,
``numpy.ma.MaskedArray``), anything. The numpy constructors are replaced by checked
wrappers, so a pickle cannot hand them a different class or an object dtype; ``ndarray``
itself is given as a marker that only those wrappers accept, so it cannot be instantiated
by ``NEWOBJ``. Persistent ids are refused. BUILD (``__setstate__``, or setting attributes)
is admitted only on an ndarray or a dtype, once each, and a dtype's state may not claim the
flags of an object dtype (numpy takes them as given). That check needs the pure-Python
unpickler (about 4x the C one's time: 36 against 9 us for a record of 784 floats). Refusals
raise :class:`UnsafePickleError`.

Python 2 pickles (Paddle's v2 era) read with ``encoding="latin1"``, as numpy advises, so a
Python 2 ``str`` arrives as ``str``.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any

import numpy as np

from loader.errors import DataError

ADMITTED = "numpy arrays, numbers, strings, bytes, lists, tuples and dicts"
_NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric")


class UnsafePickleError(DataError):
    """A pickle names a global that the restricted unpickler does not admit."""


class _NdarrayMarker:
    """Stands for ``numpy.ndarray`` inside a pickle: accepted by the wrappers, constructs nothing."""

    __slots__ = ()

    def __reduce__(self) -> Any:  # never pickled; refuse rather than leak
        raise TypeError("the ndarray marker of the restricted unpickler cannot be pickled")


_NDARRAY = _NdarrayMarker()


def _plain_dtype(value: Any) -> np.dtype:
    dtype = np.dtype(value)
    if dtype.hasobject:
        raise UnsafePickleError(f"refused a numpy dtype holding Python objects ({dtype}); admitted: {ADMITTED}")
    return dtype


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    # numpy's pickles always pass ndarray and shape (0,); the real contents arrive by BUILD (__setstate__).
    if subtype is not _NDARRAY:
        raise UnsafePickleError(f"refused an array of class {_name_of(subtype)} (only numpy.ndarray itself)")
    del shape  # never allocate what the pickle asks for: __setstate__ gives the real shape
    return np.ndarray((0,), dtype=np.uint8 if isinstance(dtype, (bytes, str)) else _plain_dtype(dtype))


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    array = np.frombuffer(bytes(buffer), dtype=_plain_dtype(dtype))
    return array.reshape(tuple(int(d) for d in shape), order="F" if order == "F" else "C").copy()


def _scalar(dtype: Any, data: Any = None) -> Any:
    plain = _plain_dtype(dtype)
    raw = data.encode("latin1") if isinstance(data, str) else bytes(data or b"")
    return np.frombuffer(raw, dtype=plain, count=1)[0]


def _dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    if isinstance(spec, bytes):
        spec = spec.decode("latin1")
    del copy  # always a copy: BUILD then sets the state of this dtype, never of numpy's shared float64
    return _plain_dtype(np.dtype(spec, align=bool(align), copy=True))


def _latin1(text: Any, encoding: Any = "utf-8") -> bytes:
    if encoding != "latin1" or not isinstance(text, str):
        raise UnsafePickleError(f"refused _codecs.encode with encoding {encoding!r} (only 'latin1', for bytes)")
    return text.encode("latin1")


def _name_of(obj: Any) -> str:
    if obj is _NDARRAY:
        return "numpy.ndarray"
    kind = obj if isinstance(obj, type) else type(obj)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)}"


# complex numbers pickle through their class; Python 2 named the builtins module __builtin__.
_ADMITTED: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _latin1,
    ("builtins", "complex"): complex,
    ("__builtin__", "complex"): complex,
}
for _module in _NUMPY_MODULES:
    _ADMITTED[(_module, "_reconstruct")] = _reconstruct
    _ADMITTED[(_module, "scalar")] = _scalar
    _ADMITTED[(_module, "_frombuffer")] = _frombuffer
for _module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray"):
    _ADMITTED[(_module, "ndarray")] = _NDARRAY
    _ADMITTED[(_module, "dtype")] = _dtype


# Flags that only object dtypes carry (holds references, list pickle, is a pointer, uses getitem/setitem): numpy
# takes a dtype's flags from its pickled state as given, and frees an array whose dtype claims them as if its
# bytes were object pointers. Plain dtypes carry none of them (unicode has NEEDS_INIT, structured NEEDS_PYAPI).
_OBJECT_DTYPE_FLAGS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
_FLAGS_AT = 7  # (version, byte order, subarray, names, fields, item size, alignment, flags[, metadata])


class _Restricted(pickle._Unpickler):
    """The pure-Python unpickler, whose BUILD opcode can be checked (the C one's cannot): BUILD calls
    ``__setstate__`` or sets attributes on whatever object is on the stack, our admitted functions too."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._built: dict[int, Any] = {}  # id -> the object BUILD set up, held so its id stays its own

    def find_class(self, module: str, name: str) -> Any:
        found = _ADMITTED.get((module, name))
        if found is None:
            raise UnsafePickleError(f"refused global {module}.{name}; only {ADMITTED} are unpickled")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused a persistent id; only plain data is unpickled")

    def _load_build(self) -> None:
        """BUILD only for what numpy's pickles build, once each: an ndarray's contents, a dtype's plain state."""
        stack: list[Any] = self.stack  # type: ignore[attr-defined]  # the pure-Python unpickler's own
        if len(stack) < 2:
            raise pickle.UnpicklingError("BUILD with nothing to build")
        state, target = stack[-1], stack[-2]
        if type(target) is not np.ndarray and not isinstance(target, np.dtype):
            raise UnsafePickleError(f"refused to set the state of a {_name_of(target)}; only {ADMITTED}")
        if id(target) in self._built:  # a dtype rebuilt after an array took it would change that array's meaning
            raise UnsafePickleError(f"refused to set the state of one {_name_of(target)} twice")
        self._built[id(target)] = target
        if isinstance(target, np.dtype):
            _check_dtype_state(state)
        # An ndarray's __setstate__ takes a dtype built here (checked), a shape and raw bytes, and checks their sizes.
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]
        if isinstance(target, np.dtype) and target.flags & _OBJECT_DTYPE_FLAGS:
            raise UnsafePickleError(f"refused a numpy dtype holding Python objects ({target}); admitted: {ADMITTED}")

    dispatch[pickle.BUILD[0]] = _load_build  # type: ignore[assignment]


def _check_dtype_state(state: Any) -> None:
    """A dtype's ``__setstate__`` argument: numpy's tuple, whose flags (when given) are a plain dtype's."""
    if not isinstance(state, tuple) or not state:
        raise UnsafePickleError(f"refused a numpy dtype state that is not numpy's: {_short(state)}")
    if len(state) > _FLAGS_AT:
        flags = state[_FLAGS_AT]
        if not isinstance(flags, int) or isinstance(flags, bool):
            raise UnsafePickleError(f"refused a numpy dtype state whose flags are not a number: {_short(state)}")
        if flags & _OBJECT_DTYPE_FLAGS:
            raise UnsafePickleError(f"refused a numpy dtype state with the flags of an object dtype ({flags:#x})")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def is_pickle(data: bytes | bytearray | memoryview) -> bool:
    """True when ``data`` parses as one complete pickle (read with ``pickletools``, nothing executed)."""
    raw = bytes(data)
    if len(raw) < 2 or raw[-1:] != b".":
        return False
    try:
        last = None
        for op in pickletools.genops(raw):
            last = op
    except Exception:  # any parse failure means "not a pickle"
        return False
    return last is not None and last[0].name == "STOP" and last[2] == len(raw) - 1


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Unpickle ``data`` admitting only plain data (see the module docstring).

    A refused global raises :class:`UnsafePickleError` naming it; a malformed pickle raises
    ``DataError``.
    """
    unpickler = _Restricted(io.BytesIO(bytes(data)), encoding="latin1")
    try:
        value = unpickler.load()
    except UnsafePickleError:
        raise
    except RecursionError:
        raise DataError("malformed pickle: nested too deeply") from None
    except Exception as exc:  # untrusted bytes; every failure is a data error
        raise DataError(f"malformed pickle: {type(exc).__name__}: {exc}") from None
    return _check_value(value)


_PLAIN = (bool, int, float, complex, str, bytes, bytearray, type(None), np.generic, np.dtype)


def _check_value(value: Any) -> Any:
    """Refuse anything but admitted types in the result: a pickle may return a set (protocol 4 builds
    one without a global), or an admitted global or marker itself."""
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, np.ndarray):
            if type(item) is not np.ndarray or item.dtype.hasobject:
                raise UnsafePickleError(f"refused an array of class {_name_of(item)}; only {ADMITTED}")
        elif not isinstance(item, _PLAIN) or isinstance(item, type):
            raise UnsafePickleError(f"refused a value of type {_name_of(item)}; only {ADMITTED} are unpickled")
    return value


__all__ = ["ADMITTED", "UnsafePickleError", "is_pickle", "loads"]
