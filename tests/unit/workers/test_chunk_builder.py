"""``ChunkBuilder``: whether a sample of a lease group's next file may share the chunk (``fits``), and when a
chunk is due by its size."""

from __future__ import annotations

import numpy as np
import pytest

import workers.columns as columns
from loader.service.shm import refs as R
from loader.service.shm.pool import ArenaPool
from workers.arena_writer import ArenaWriter
from workers.columns import MAX_CHUNK_BYTES, ChunkBuilder


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


MIB = 1024 * 1024
IMAGE = np.zeros((3, 224, 224), np.float32)  # 588 KiB: a row that travels through the arena


@pytest.fixture(autouse=True)
def no_chunk_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns, "MAX_CHUNK_DELAY_S", 3600.0)  # only sizes end these chunks, however slow the run


def _rows_until_due(builder: ChunkBuilder, make: object, limit: int = 5000) -> int:
    for record in range(limit):
        builder.add(record, make(record))  # type: ignore[operator]
        if builder.due:
            return record + 1
    raise AssertionError("never due")


def test_without_an_arena_a_chunk_of_big_rows_is_due_at_the_message_bound() -> None:
    builder = ChunkBuilder(["image", "label"], 4096)
    assert _rows_until_due(builder, lambda r: (IMAGE, r)) == -(-MAX_CHUNK_BYTES // IMAGE.nbytes)


def test_rows_that_go_by_reference_fill_a_chunk_up_to_the_arena_bound_and_small_fields_still_count() -> None:
    builder = ChunkBuilder(["image", "label"], 4096, max_ref_bytes=32 * MIB)
    assert _rows_until_due(builder, lambda r: (IMAGE, r)) == -(-32 * MIB // IMAGE.nbytes)
    columns, records = builder.take()
    assert columns["image"].shape == (len(records), *IMAGE.shape)
    # Small rows travel inline whatever the arena: the message bound holds for them.
    small = np.zeros(1024, np.float32)
    assert _rows_until_due(builder, lambda r: (small, r)) == -(-MAX_CHUNK_BYTES // (small.nbytes + 8))
    builder.take()
    # A big field beside the image that travels inline (bytes of its own) still ends the chunk at the bound.
    text = np.zeros(60 * 1024, np.uint8)  # under the arena's smallest row
    roomy = ChunkBuilder(["image", "text"], 4096, max_ref_bytes=64 * MIB)
    assert _rows_until_due(roomy, lambda r: (IMAGE, text)) == -(-MAX_CHUNK_BYTES // text.nbytes)
    roomy.take()
    raw = bytes(100 * 1024)  # bytes count by their length too
    assert _rows_until_due(roomy, lambda r: (IMAGE, raw)) == -(-MAX_CHUNK_BYTES // len(raw))


def test_big_rows_that_turn_ragged_count_as_inline_from_then_on() -> None:
    builder = ChunkBuilder(["image"], 4096, max_ref_bytes=64 * MIB)
    for record in range(7):  # 4.0 MiB, by reference: not due
        builder.add(record, (IMAGE,))
    assert not builder.due
    builder.add(7, (np.zeros((3, 200, 200), np.float32),))  # ragged: the column is objects, sent inline
    assert builder.due, "the 4.5 MiB now travel inline: past the message bound"
    columns, _ = builder.take()
    assert columns["image"].dtype == object
    # A sample limit still ends a chunk of references.
    capped = ChunkBuilder(["image"], 8, max_ref_bytes=64 * MIB)
    assert _rows_until_due(capped, lambda r: (IMAGE,)) == 8


# -- big rows placed in the arena as each sample is added --------------------------------------


@pytest.fixture
def arena_pool(tmp_path):
    with ArenaPool(8 * MIB, directory=str(tmp_path)) as pool:
        yield pool


def _writer(pool):
    return ArenaWriter(pool.create())


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((3, 224, 224), dtype=np.float32)


def test_each_big_row_goes_into_the_arena_when_added_and_the_chunk_sends_those_references(arena_pool) -> None:
    writer = _writer(arena_pool)
    builder = ChunkBuilder(["image", "label"], 64, max_ref_bytes=64 * MIB, arena=writer)
    images = [_image(i) for i in range(5)]
    per_row = writer.arena.blocks_for(IMAGE.nbytes)
    for record, image in enumerate(images):
        builder.add(record, (image, record))
        assert writer.arena.used_blocks() == (record + 1) * per_row, "placed as it was added, not at the chunk"
    columns, records, placed = builder.take_placed(writer)
    assert writer.arena.used_blocks() == 5 * per_row, "the chunk took the rows placed already: no second copy"
    assert placed == {"image": ("<f4", (3, 224, 224))}
    assert records.tolist() == [0, 1, 2, 3, 4] and columns["label"].tolist() == [0, 1, 2, 3, 4]
    out = R.gather(columns["image"], {0: placed["image"]}, arena_pool.get)
    assert np.array_equal(out, np.stack(images))
    assert writer.arena.used_blocks() == 0


def test_a_row_that_finds_no_room_cuts_the_chunk_before_it_and_the_next_chunk_goes_inline(arena_pool) -> None:
    writer = _writer(arena_pool)
    per_row = writer.arena.blocks_for(IMAGE.nbytes)
    room = writer.arena.n_blocks // per_row  # 13 rows of 588 KiB in 8 MiB
    builder = ChunkBuilder(["image", "label"], 64, max_ref_bytes=64 * MIB, arena=writer)
    images = [_image(i) for i in range(room + 3)]
    for record in range(room):
        assert builder.add(record, (images[record], record))
    assert not builder.add(room, (images[room], room)), "no room beside the chunk's rows: cut here"
    assert len(builder) == room and writer.arena.used_blocks() == room * per_row, "the refused sample took nothing"
    columns, records, placed = builder.take_placed(writer)
    assert set(placed) == {"image"} and records.tolist() == list(range(room)), "the chunk went by reference"
    assert np.array_equal(R.gather(columns["image"], {0: placed["image"]}, arena_pool.get), np.stack(images[:room]))
    assert writer.arena.used_blocks() == 0
    # The next chunk: its first row found no room (the arena filled meanwhile), so its column goes inline, and
    # its later rows are not placed even once there is room (they would only be copied out again).
    hog = writer.arena.alloc(writer.arena.n_blocks, 1)
    assert builder.add(room, (images[room], room)), "an empty chunk takes any sample"
    writer.arena.free(hog, 1)
    for record in (room + 1, room + 2):
        assert builder.add(record, (images[record], record))
    assert writer.arena.used_blocks() == 0
    columns, records, placed = builder.take_placed(writer)
    assert records.tolist() == [room, room + 1, room + 2]
    # At the cut, the arena has room again: the rows go there from each sample's array (put_rows), as before.
    assert placed == {"image": ("<f4", (3, 224, 224))} and writer.arena.used_blocks() == per_row * 3
    assert np.array_equal(R.gather(columns["image"], {0: placed["image"]}, arena_pool.get), np.stack(images[room:]))


def test_a_sample_refused_for_one_column_gives_back_what_it_placed_for_another(arena_pool) -> None:
    writer = _writer(arena_pool)
    builder = ChunkBuilder(["a", "b"], 64, max_ref_bytes=64 * MIB, arena=writer)
    assert builder.add(0, (_image(0), np.zeros(300_000, np.uint8)))  # 588 KiB + 293 KiB a sample
    used = writer.arena.used_blocks()
    free = writer.arena.n_blocks - used
    hog = writer.arena.alloc(free - writer.arena.blocks_for(IMAGE.nbytes), 1)  # room for one more image, no more
    assert hog is not None
    assert not builder.add(1, (_image(1), np.zeros(300_000, np.uint8)))
    assert writer.arena.used_blocks() == used + len(hog), "the image placed for the refused sample went back"


def test_a_discarded_chunk_gives_its_rows_back_and_a_taken_one_owns_no_arena_memory(arena_pool) -> None:
    writer = _writer(arena_pool)
    builder = ChunkBuilder(["image"], 64, max_ref_bytes=64 * MIB, arena=writer)
    for record in range(4):
        builder.add(record, (_image(record),))
    assert writer.arena.used_blocks() > 0
    builder.discard()
    assert writer.arena.used_blocks() == 0 and len(builder) == 0
    # Ragged after rows were placed: an object column of copies, not of views of blocks now free.
    images = [_image(10), _image(11), np.ones((3, 100, 100), np.float32)]
    for record, image in enumerate(images):
        builder.add(record, (image,))
    columns, _ = builder.take()
    assert columns["image"].dtype == object and writer.arena.used_blocks() == 0
    writer.arena.data[:] = 0  # whatever the worker writes next into those blocks
    for got, want in zip(columns["image"], images):
        assert np.array_equal(got, want)


def test_rows_placed_in_an_arena_a_re_welcome_replaced_are_copied_out_not_referenced(arena_pool) -> None:
    old, new = _writer(arena_pool), _writer(arena_pool)
    builder = ChunkBuilder(["image"], 64, max_ref_bytes=64 * MIB, arena=old)
    images = [_image(i) for i in range(3)]
    for record, image in enumerate(images):
        builder.add(record, (image,))
    old.close()  # the worker's re-welcome closed it while the chunk was open
    columns, _, placed = builder.take_placed(new)
    assert set(placed) == {"image"} and int(columns["image"][0, 0]) == new.arena.arena_id
    assert np.array_equal(R.gather(columns["image"], {0: placed["image"]}, arena_pool.get), np.stack(images))


def test_a_column_that_fails_to_stack_gives_back_what_the_chunk_took_and_nothing_twice(
    arena_pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(arena_pool)
    builder = ChunkBuilder(["a", "b", "c"], 64, max_ref_bytes=64 * MIB, arena=writer)
    for record in range(3):
        builder.add(record, (_image(record), _image(record + 10), np.zeros(4)))

    def out_of_memory(values):
        raise MemoryError("stacking column c")

    monkeypatch.setattr(columns, "stack_column", out_of_memory)
    with pytest.raises(MemoryError):
        builder.take_placed(writer)
    assert writer.arena.used_blocks() == 0, "the rows of a and b went back"
    others = writer.arena.alloc(6, writer.arena.blocks_for(IMAGE.nbytes))  # another chunk's rows, in those blocks
    assert others is not None
    taken = writer.arena.used_blocks()
    builder.discard()  # the worker's finally
    assert writer.arena.used_blocks() == taken, "discard freed a's and b's rows again: another chunk's blocks"
