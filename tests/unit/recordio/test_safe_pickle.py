"""The restricted unpickler, fuzzed with hostile pickles: every one must be refused, nothing may run."""

from __future__ import annotations

import copyreg
import os
import pickle
import pickletools
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.errors import DataError
from loader.recordio import safe_pickle
from loader.recordio.safe_pickle import UnsafePickleError


@pytest.fixture(autouse=True)
def tripwires(monkeypatch):
    """Anything that would run a command or evaluate code records the attempt instead."""
    calls = []
    for module, name in ((os, "system"), (os, "popen"), (subprocess, "Popen"), (subprocess, "call")):
        monkeypatch.setattr(module, name, lambda *a, _n=name, **k: calls.append(_n))
    yield calls
    assert calls == [], f"hostile code ran: {calls}"


def _global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _call(module: str, name: str, *args: str) -> bytes:
    # protocol 0: GLOBAL, MARK, string args, TUPLE, REDUCE, STOP
    return _global(module, name) + b"(" + b"".join(f"S'{a}'\n".encode() for a in args) + b"tR."


class Evil:
    def __init__(self, target, *args):
        self.target, self.args = target, args

    def __reduce__(self):
        return self.target, self.args


class SubArray(np.ndarray):
    """An ndarray subclass: refused by name even though it is 'an array'."""


HOSTILE = {
    "os.system via protocol 0": _call("os", "system", "echo pwned"),
    "posix.system": _call("posix", "system", "echo pwned"),
    "builtins.eval": _call("builtins", "eval", "__import__('os').system('echo pwned')"),
    "builtins.exec": _call("builtins", "exec", "import os"),
    "builtins.getattr": _call("builtins", "getattr", "x", "y"),
    "builtins.__import__": _call("builtins", "__import__", "os"),
    "__builtin__.eval (python 2 name)": _call("__builtin__", "eval", "1"),
    "subprocess.Popen": _call("subprocess", "Popen", "ls"),
    "numpy.load": _call("numpy", "load", "/etc/passwd"),
    "numpy.memmap": _call("numpy", "memmap", "/tmp/x"),
    "numpy.testing": _call("numpy.testing", "assert_equal", "a", "b"),
    "copyreg._reconstructor": _call("copyreg", "_reconstructor", "a", "b"),
    "os.system via protocol 2": pickle.dumps(Evil(os.system, "echo pwned"), protocol=2),
    "os.system via protocol 5": pickle.dumps(Evil(os.system, "echo pwned"), protocol=5),
    "nested reduce in a tuple": pickle.dumps((1, [2, {"k": Evil(os.system, "x")}]), protocol=4),
    "nested reduce as an argument": pickle.dumps(Evil(str, Evil(os.system, "x")), protocol=4),
    "ndarray subclass": pickle.dumps(np.arange(3).view(SubArray), protocol=4),
    "masked array": pickle.dumps(np.ma.masked_array([1, 2], mask=[0, 1]), protocol=2),
    "object array": pickle.dumps(np.array([1, "a", None], dtype=object), protocol=2),
    "set": pickle.dumps({1, 2}, protocol=4),
    # _reconstruct handed a class other than ndarray: protocol 0, GLOBAL numpy.memmap as the subtype.
    "_reconstruct with a foreign subtype": _global("numpy.core.multiarray", "_reconstruct")
    + b"("
    + _global("numpy", "memmap")
    + b"(I0\ntS'b'\ntR.",
    # _reconstruct handed a harmless-looking callable as the subtype.
    "_reconstruct with dtype as subtype": _global("numpy.core.multiarray", "_reconstruct")
    + b"("
    + _global("numpy", "dtype")
    + b"(I0\ntS'b'\ntR.",
    # NEWOBJ on the ndarray marker (protocol 2): cls.__new__ must not build anything.
    "NEWOBJ on ndarray": b"\x80\x02" + _global("numpy", "ndarray") + b"K\x05\x85\x81.",
    # _codecs.encode with another codec than latin1.
    "_codecs.encode rot13": _call("_codecs", "encode", "abc", "rot13"),
    # A pickle whose value is an admitted global itself.
    "bare admitted global": _global("numpy", "ndarray") + b".",
    "bare complex class": _global("builtins", "complex") + b".",
    "persistent id": b"Pabc\n.",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_pickles_are_refused(name):
    with pytest.raises(DataError) as info:
        safe_pickle.loads(HOSTILE[name])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name",
    [
        "os.system via protocol 0",
        "posix.system",
        "builtins.eval",
        "numpy.memmap",
        "nested reduce in a tuple",
        "ndarray subclass",
        "copyreg._reconstructor",
    ],
)
def test_a_refused_global_is_named(name):
    with pytest.raises(UnsafePickleError, match=r"refused (global|an array of class) [\w.]+"):
        safe_pickle.loads(HOSTILE[name])


def test_extension_registry_codes_go_through_the_same_refusal():
    code = 240_123  # a private extension code naming posix.system, as a hostile environment might register
    copyreg.add_extension("posix", "system", code)
    try:
        evil = b"\x80\x02\x84" + code.to_bytes(4, "little") + b"X\x01\x00\x00\x00x\x85R."  # EXT4, ('x',), REDUCE
        with pytest.raises(UnsafePickleError, match="posix.system"):
            safe_pickle.loads(evil)
    finally:
        copyreg.remove_extension("posix", "system", code)


@pytest.mark.parametrize("protocol", range(6))
def test_plain_data_round_trips_at_every_protocol(protocol):
    values = [
        (1, 2, 3),
        {"image": np.arange(6, dtype=np.uint8).reshape(2, 3), 7: [1.5, -2, None, True]},
        np.zeros((2, 2), dtype=np.complex64),
        np.float32(2.5),
        b"\x00\xffbytes",
        "text",
        3 + 4j,
        np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    ]
    for value in values:
        got = safe_pickle.loads(pickle.dumps(value, protocol=protocol))
        if isinstance(value, np.ndarray):
            assert np.array_equal(got, value) and got.dtype == value.dtype
        elif isinstance(value, dict):
            assert np.array_equal(got["image"], value["image"]) and got[7] == value[7]
        else:
            assert got == value and type(got) is type(value)


def _text(value: str) -> bytes:  # protocol 2's BINUNICODE
    raw = value.encode()
    return b"X" + len(raw).to_bytes(4, "little") + raw


def _dtype_with_state(state: tuple) -> bytes:
    # numpy.dtype('f8', False, True), then BUILD with ``state``: how numpy pickles a dtype, with the state swapped.
    return (
        b"\x80\x02" + _global("numpy", "dtype") + _text("f8") + b"\x89\x88\x87R" + pickle.dumps(state, 2)[2:-1] + b"b."
    )


def test_a_dtype_whose_state_claims_object_flags_is_refused_before_numpy_takes_it():
    # Flag 1 (holds references) on float64: numpy would free the array's floats as object pointers.
    with pytest.raises(UnsafePickleError, match="flags of an object dtype"):
        safe_pickle.loads(_dtype_with_state((3, "<", None, None, None, -1, -1, 1)))
    with pytest.raises(UnsafePickleError, match="not numpy's"):
        safe_pickle.loads(_dtype_with_state(()))
    assert safe_pickle.loads(_dtype_with_state((3, ">", None, None, None, -1, -1, 0))) == np.dtype(">f8")
    assert np.dtype("f8").byteorder == "="  # numpy's own float64 was never the one built


def test_a_dtype_is_built_once_so_an_array_that_took_it_keeps_its_meaning():
    array = pickle.dumps(np.arange(3.0), 2)
    # The memo slot numpy's pickle puts the array's dtype in: the BINPUT after the REDUCE of numpy.dtype.
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(array)]
    after_dtype = ops[[i for i, (name, arg) in enumerate(ops) if arg == "numpy dtype"][0] :]
    slot = next(arg for (name, arg), (before, _) in zip(after_dtype[1:], after_dtype) if before == "REDUCE")
    # Then the array's dtype is fetched again and built a second time (a plain state: refused all the same).
    rebuild = array[:-1] + b"0h" + bytes([slot]) + pickle.dumps((3, "<", None, None, None, -1, -1, 0), 2)[2:-1] + b"b."
    assert safe_pickle.loads(array[:-1] + b"0h" + bytes([slot]) + b".") == np.dtype("f8")  # the slot is the dtype
    with pytest.raises(UnsafePickleError, match="twice"):
        safe_pickle.loads(rebuild)


def test_build_cannot_set_attributes_of_the_admitted_functions():
    # BUILD with (None, {"__defaults__": ("latin1",)}) on _codecs.encode: it used to change our wrapper for good.
    evil = b"\x80\x02" + _global("_codecs", "encode") + b"N}" + _text("__defaults__") + _text("latin1") + b"\x85s\x86b."
    with pytest.raises(UnsafePickleError, match="refused to set the state of a builtins.function"):
        safe_pickle.loads(evil)
    with pytest.raises(UnsafePickleError, match="only 'latin1'"):
        safe_pickle.loads(_call("_codecs", "encode", "abc"))  # the default encoding is still utf-8: refused


def test_python2_pickles_of_text_and_numpy_read():
    assert safe_pickle.loads(b"(S'word'\np0\nI3\ntp1\n.") == ("word", 3)
    assert safe_pickle.loads(b"(lp0\nI1\naF2.5\na.") == [1, 2.5]


def test_is_pickle_only_parses():
    assert safe_pickle.is_pickle(HOSTILE["os.system via protocol 0"])  # it is one; parsing ran nothing
    assert not safe_pickle.is_pickle(b"\x93\x01\x02\x03")  # msgpack
    assert not safe_pickle.is_pickle(b"hello")


_GOOD = [pickle.dumps(v, protocol=p) for p in (0, 2, 4, 5) for v in ((1, "a", b"b"), np.arange(4.0), {"x": [1, 2]})]
_SEEDS = _GOOD + list(HOSTILE.values())


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # numpy freeing a bad dtype's array
@settings(max_examples=400, deadline=None)
@given(
    seed=st.sampled_from(_SEEDS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 10_000),
)
def test_fuzz_mutated_pickles_never_run_code(seed, edits, cut):
    data = bytearray(seed)
    for pos, byte in edits:
        data[pos % len(data)] = byte
    data = data[: max(1, cut % (len(data) + 1))] if cut % 3 == 0 else data
    try:
        value = safe_pickle.loads(bytes(data))
    except DataError:
        return  # refused or malformed: both fine
    _assert_plain(value)


def _assert_plain(value):
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, np.ndarray):
            assert type(item) is np.ndarray and not item.dtype.hasobject
        else:
            plain = (int, float, complex, str, bytes, bytearray, type(None), np.generic, np.dtype)
            assert isinstance(item, plain), item
