"""A module alias ``paddle`` -> ``loader`` for running Paddle-style test code against this package.

``install(monkeypatch)`` puts a ``paddle`` module into ``sys.modules`` whose attributes are
``loader``'s (``paddle.reader``, ``paddle.reader.creator``, ``paddle.reader.decorator``,
``paddle.batch``) plus the few pieces of Paddle's *framework* that its data tests touch and
that this package does not provide on purpose: places, ``layers.data`` / ``static.data``
(a variable with name, shape, dtype and lod_level) and a ``Program`` holding them. Those
stand-ins are deliberately tiny; everything the tests assert on is ``loader``'s own code.
Everything is removed again when the test ends (``monkeypatch``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import sys
import types
from collections.abc import Iterator
from typing import Any

import loader
import loader.reader
import loader.reader.creator
import loader.reader.decorator


class VarType(enum.IntEnum):
    """Fluid's dtype enum, as a ``Variable.dtype`` shows it (``VarType.FP32``)."""

    BOOL = 0
    INT16 = 1
    INT32 = 2
    INT64 = 3
    FP16 = 4
    FP32 = 5
    FP64 = 6
    UINT8 = 20
    INT8 = 21


class CPUPlace:
    """Stands in for ``fluid.CPUPlace()``: recognised by class name."""


class CUDAPlace:
    def __init__(self, device_id: int) -> None:
        self.device_id = device_id

    def get_device_id(self) -> int:
        return self.device_id


@dataclasses.dataclass
class Variable:
    """What ``fluid.layers.data`` made: name, shape (batch dimension first), dtype, lod_level."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    lod_level: int = 0


@dataclasses.dataclass
class Value:
    """What Paddle 3's ``paddle.static.data`` makes in PIR mode: no ``lod_level`` (Paddle 3 dropped LoD)."""

    name: str
    shape: tuple[int, ...]
    dtype: Any


class Block:
    def __init__(self) -> None:
        self.vars: dict[str, Any] = {}

    def var(self, name: str) -> Any:
        if name not in self.vars:
            raise ValueError(f"var {name} not in this block")
        return self.vars[name]


class Program:
    def __init__(self) -> None:
        self._block = Block()

    def global_block(self) -> Block:
        return self._block

    def block(self, index: int) -> Block:
        return self._block


_DTYPES = {
    "float32": VarType.FP32,
    "float64": VarType.FP64,
    "int64": VarType.INT64,
    "int32": VarType.INT32,
    "uint8": VarType.UINT8,
    "bool": VarType.BOOL,
    "float16": VarType.FP16,
}


class _Framework:
    """The default main program and ``program_guard``, as fluid kept them."""

    def __init__(self) -> None:
        self.main = Program()

    def data(
        self, name: str, shape: Any, dtype: str = "float32", lod_level: int = 0, append_batch_size: bool = True
    ) -> Variable:
        dims = tuple(int(d) for d in shape)
        if append_batch_size and (not dims or dims[0] != -1):
            dims = (-1, *dims)  # fluid.layers.data prepended the batch dimension
        var = Variable(name, dims, _DTYPES[dtype], lod_level)
        self.main.global_block().vars[name] = var
        return var

    def static_data(self, name: str, shape: Any, dtype: str = "float32", lod_level: int = 0) -> Value:
        value = Value(name, tuple(-1 if d is None else int(d) for d in shape), _DTYPES[dtype])  # lod_level: ignored
        self.main.global_block().vars[name] = value
        return value

    @contextlib.contextmanager
    def program_guard(self, main: Program, startup: Program | None = None) -> Iterator[None]:
        saved, self.main = self.main, main
        try:
            yield
        finally:
            self.main = saved


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def install(monkeypatch: Any) -> types.ModuleType:
    """Install the alias; returns the ``paddle`` module."""
    framework = _Framework()
    fluid = _module(
        "paddle.fluid",
        DataFeeder=loader.DataFeeder,
        CPUPlace=CPUPlace,
        CUDAPlace=CUDAPlace,
        LoDTensor=loader.LoDTensor,
        layers=_module("paddle.fluid.layers", data=framework.data),
        default_main_program=lambda: framework.main,
        Program=Program,
        program_guard=framework.program_guard,
    )
    static = _module(
        "paddle.static",
        data=framework.static_data,
        Program=Program,
        program_guard=framework.program_guard,
        default_main_program=lambda: framework.main,
    )
    paddle = _module("paddle", fluid=fluid, base=fluid, static=static, enable_static=lambda: None)
    paddle.__getattr__ = lambda name: getattr(loader, name)  # type: ignore[attr-defined] - the alias itself
    modules = {
        "paddle": paddle,
        "paddle.fluid": fluid,
        "paddle.base": fluid,
        "paddle.static": static,
        "paddle.reader": loader.reader,
        "paddle.reader.creator": loader.reader.creator,
        "paddle.reader.decorator": loader.reader.decorator,
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return paddle


__all__ = ["install", "VarType", "CPUPlace", "CUDAPlace", "Variable", "Value", "Program"]
