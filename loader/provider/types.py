"""Slot types of PyDataProvider2: ``InputType`` and its helpers (``dense_vector`` ...)."""

from __future__ import annotations

import dataclasses
import enum


class SequenceType(enum.IntEnum):
    """How a slot nests: one value, a sequence of values, or a sequence of sequences."""

    NO_SEQUENCE = 0
    SEQUENCE = 1
    SUB_SEQUENCE = 2

    @classmethod
    def tostring(cls, value: int) -> str:
        try:
            return f"SequenceType.{cls(value).name}"
        except ValueError:
            return f"INVALID({value})"


class DataType(enum.IntEnum):
    """What one value of a slot is."""

    Dense = 0
    SparseNonValue = 1
    SparseValue = 2
    Index = 3


class CacheType(enum.IntEnum):
    """``NO_CACHE`` reads the files every pass; ``CACHE_PASS_IN_MEM`` only on the first."""

    NO_CACHE = 0
    CACHE_PASS_IN_MEM = 1


@dataclasses.dataclass(frozen=True)
class InputType:
    """One slot: ``dim`` (vector size, or the range of an integer), nesting and value type."""

    dim: int
    seq_type: SequenceType
    type: DataType

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"InputType dim must be a positive int, got {self.dim!r}")
        object.__setattr__(self, "seq_type", SequenceType(self.seq_type))
        object.__setattr__(self, "type", DataType(self.type))

    def __repr__(self) -> str:
        return f"InputType(dim={self.dim}, seq_type={SequenceType.tostring(self.seq_type)}, type=DataType.{self.type.name})"


def dense_slot(dim: int, seq_type: SequenceType = SequenceType.NO_SEQUENCE) -> InputType:
    """A dense float vector of ``dim`` values (a list of numbers or a numpy array)."""
    return InputType(dim, seq_type, DataType.Dense)


def sparse_non_value_slot(dim: int, seq_type: SequenceType = SequenceType.NO_SEQUENCE) -> InputType:
    """A sparse 0/1 vector given as the list of the column ids that are 1."""
    return InputType(dim, seq_type, DataType.SparseNonValue)


def sparse_value_slot(dim: int, seq_type: SequenceType = SequenceType.NO_SEQUENCE) -> InputType:
    """A sparse float vector given as a list of ``(column id, value)`` pairs."""
    return InputType(dim, seq_type, DataType.SparseValue)


def index_slot(value_range: int, seq_type: SequenceType = SequenceType.NO_SEQUENCE) -> InputType:
    """An integer in ``[0, value_range)`` (a label, a word id)."""
    return InputType(value_range, seq_type, DataType.Index)


dense_vector = dense_array = dense_slot
sparse_binary_vector = sparse_non_value_slot
sparse_float_vector = sparse_vector = sparse_value_slot
integer_value = index_slot


def dense_vector_sequence(dim: int) -> InputType:
    return dense_vector(dim, SequenceType.SEQUENCE)


def dense_vector_sub_sequence(dim: int) -> InputType:
    return dense_vector(dim, SequenceType.SUB_SEQUENCE)


def sparse_binary_vector_sequence(dim: int) -> InputType:
    return sparse_binary_vector(dim, SequenceType.SEQUENCE)


def sparse_binary_vector_sub_sequence(dim: int) -> InputType:
    return sparse_binary_vector(dim, SequenceType.SUB_SEQUENCE)


def sparse_float_vector_sequence(dim: int) -> InputType:
    return sparse_float_vector(dim, SequenceType.SEQUENCE)


def sparse_float_vector_sub_sequence(dim: int) -> InputType:
    return sparse_float_vector(dim, SequenceType.SUB_SEQUENCE)


sparse_vector_sequence = sparse_float_vector_sequence
sparse_vector_sub_sequence = sparse_float_vector_sub_sequence


def integer_value_sequence(value_range: int) -> InputType:
    return integer_value(value_range, SequenceType.SEQUENCE)


def integer_value_sub_sequence(value_range: int) -> InputType:
    return integer_value(value_range, SequenceType.SUB_SEQUENCE)


integer_sequence = integer_value_sequence

__all__ = [
    "SequenceType",
    "DataType",
    "CacheType",
    "InputType",
    "dense_slot",
    "sparse_non_value_slot",
    "sparse_value_slot",
    "index_slot",
    "dense_vector",
    "dense_array",
    "sparse_binary_vector",
    "sparse_float_vector",
    "sparse_vector",
    "integer_value",
    "dense_vector_sequence",
    "dense_vector_sub_sequence",
    "sparse_binary_vector_sequence",
    "sparse_binary_vector_sub_sequence",
    "sparse_float_vector_sequence",
    "sparse_float_vector_sub_sequence",
    "sparse_vector_sequence",
    "sparse_vector_sub_sequence",
    "integer_value_sequence",
    "integer_value_sub_sequence",
    "integer_sequence",
]
