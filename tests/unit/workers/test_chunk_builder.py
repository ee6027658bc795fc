"""``ChunkBuilder.fits``: whether a sample of a lease group's next file may share the chunk."""

from __future__ import annotations

import numpy as np

from workers.columns import ChunkBuilder


def test_a_sample_fits_a_chunk_of_its_layout_and_not_one_of_another() -> None:
    builder = ChunkBuilder(["x", "y"], 64)
    assert builder.fits((np.zeros(3), 1)), "any sample fits an empty chunk"
    for record in range(5):
        builder.add(record, (np.zeros(3), record))
        assert builder.fits((np.ones(3), 9))
        assert not builder.fits((np.ones(4), 9)), "another shape"
        assert not builder.fits((np.ones(3, np.float32), 9)), "another dtype"
        assert not builder.fits((np.ones(3),)), "other fields"
        assert not builder.fits({"x": np.ones(3), "y": 9}), "another kind"


def test_a_field_already_ragged_takes_any_layout_and_the_builder_forgets_it_after_a_chunk() -> None:
    builder = ChunkBuilder(None, 64)
    builder.add(0, (np.zeros(3),))
    builder.add(1, (np.zeros(3),))
    assert not builder.fits((np.zeros(7),))
    builder.add(2, (np.zeros(5),))  # a reader's ragged rows: the chunk's column is of objects already
    assert builder.fits((np.zeros(7),)) and builder.fits((np.zeros(3, np.int8),))
    builder.take()
    builder.add(3, (np.zeros(3),))
    assert not builder.fits((np.zeros(7),)), "a new chunk is uniform again"
