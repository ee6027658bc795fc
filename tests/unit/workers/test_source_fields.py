"""``source.fields`` renames a reader's slots by position; it never hands one slot's name to another's data."""

from __future__ import annotations

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.recordio import Compressor, Writer
from loader.service import protocol as P
from tests.unit.workers.file_jobs import run_file_job
from workers.sources import FileSource


def _source(tmp_path, fields: list[str]) -> FileSource:
    path = tmp_path / "part-0.npz"
    np.savez(path, zz=np.arange(8, dtype=np.float32).reshape(4, 2), aa=np.arange(4, dtype=np.int64))
    config = LoaderConfig.from_dict({"source": {"files": [str(path)], "fields": fields}})
    return FileSource(config, str(path))


def test_the_files_own_names_in_another_order_are_refused_in_one_line(tmp_path) -> None:
    # np.savez keeps the keyword order: the slots are zz, aa. ["aa", "zz"] used to swap their data silently.
    with pytest.raises(ValueError, match=r"'aa' would name slot 0 \('zz'\)") as caught:
        _source(tmp_path, ["aa", "zz"])
    assert "part-0.npz" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("fields", [["zz", "aa"], ["x", "y"], ["x", "aa"]])
def test_new_names_and_the_own_names_in_place_rename_by_position(tmp_path, fields) -> None:
    source = _source(tmp_path, fields)
    try:
        block = source.read_block(4)
    finally:
        source.close()
    assert block is not None and list(block) == fields
    assert block[fields[0]].dtype == np.float32 and block[fields[1]].tolist() == [0, 1, 2, 3]


def test_loader_check_refuses_the_own_names_in_another_order_without_reading_a_batch(tmp_path) -> None:
    # `loader check --no-batch` surveys the files in the daemon's process: it listed 'aa' as the float column.
    from loader.io.survey import survey

    path = tmp_path / "part-0.npz"
    np.savez(path, zz=np.arange(8, dtype=np.float32).reshape(4, 2), aa=np.arange(4, dtype=np.int64))
    config = LoaderConfig.from_dict({"source": {"files": [str(path)], "fields": ["aa", "zz"]}})
    with pytest.raises(ValueError, match=r"'aa' would name slot 0 \('zz'\)"):
        survey(config.source)


def _recordio(path, samples: list[list[np.ndarray]]) -> bytes:
    with Writer(str(path), Compressor.NONE, max_num_records=3) as writer:
        for sample in samples:
            writer.write(sample)
    return path.read_bytes()


def test_a_damaged_first_chunk_is_skipped_alone_when_fields_are_given(tmp_path) -> None:
    # The check must not read a record to learn the file's names: a RecordIO file whose first chunk fails its
    # checksum failed to open (the whole file skipped), where the reader steps past that chunk's 3 records.
    first = bytearray(_recordio(tmp_path / "a.recordio", [[np.array([i]), np.array([-i])] for i in range(3)]))
    first[-3] ^= 0xFF  # the chunk's payload: its checksum fails, the framing holds
    rest = _recordio(tmp_path / "b.recordio", [[np.array([i]), np.array([-i])] for i in range(3, 9)])
    path = tmp_path / "part-0.recordio"
    path.write_bytes(bytes(first) + rest)
    source = {"files": [str(path)], "fields": ["a", "b"]}
    config = LoaderConfig.from_dict({"source": source, "pipeline": {"batch_size": 2, "on_error": "skip"}})
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=str(path), start=0)
    messages = [P.decode(frames) for frames in run_file_job(lease, config)]
    done = messages[-1][0]
    assert isinstance(done, P.FileDone) and (done.sent, done.skipped) == (6, 3)
    assert [int(v) for _, columns in messages[:-1] for v in np.ravel(columns["a"])] == list(range(3, 9))


def _dict_recordio(tmp_path):
    path = tmp_path / "part-0.recordio"
    with Writer(str(path), Compressor.NONE) as writer:
        for i in range(4):
            writer.write({"label": i, "image": np.full(3, i, np.float32)})  # slots: label, image
    return path


@pytest.mark.parametrize("mapped", [False, True])
def test_dict_records_whose_names_come_out_of_place_are_refused_when_read(tmp_path, mapped) -> None:
    # A RecordIO file learns its names from its first record, so the check at open saw none: the worker
    # then renamed by position, and `fields = ["image", "label"]` handed the labels to "image" silently
    # (`loader check` refused the same config).
    path = _dict_recordio(tmp_path)
    source = FileSource(
        LoaderConfig.from_dict({"source": {"files": [str(path)], "fields": ["image", "label"]}}), str(path)
    )
    try:
        with pytest.raises(ValueError, match=r"'image' would name slot 0 \('label'\)") as caught:
            next(source.samples()) if mapped else source.read_block(1)
        assert "part-0.recordio" in str(caught.value) and "\n" not in str(caught.value)
        with pytest.raises(ValueError, match="by position"):  # still refused on the next read
            next(source.samples()) if mapped else source.read_block(1)
    finally:
        source.close()


def test_dict_records_named_in_their_own_order_read_as_before(tmp_path) -> None:
    path = _dict_recordio(tmp_path)
    source = FileSource(LoaderConfig.from_dict({"source": {"files": [str(path)], "fields": ["label", "x"]}}), str(path))
    try:
        block = source.read_block(4)
    finally:
        source.close()
    assert block is not None and list(block) == ["label", "x"] and block["label"].tolist() == [0, 1, 2, 3]


def same(sample):
    """A mapper that changes nothing: the file is then read sample by sample, not in blocks."""
    return sample


HERE = __name__


def _damaged_first(tmp_path, kind: str):
    """A file of ``kind`` whose first record (or chunk) is damaged and whose others hold 3.., with no
    ``source.fields``: its names must come from its first good record, not fail the whole file at open."""
    path = tmp_path / ("part-0.txt" if kind == "text" else "part-0.recordio")
    if kind == "text":
        path.write_text("a header the parser refuses\n" + "".join(f"{i} {-i}\n" for i in range(3, 9)))
        return path, {"format": "text", "format_options": {"parser": f"{HERE}:numbers"}}, 1, ["slot0", "slot1"]
    if kind == "chunk":
        first = bytearray(_recordio(tmp_path / "a.recordio", [[np.array([i]), np.array([-i])] for i in range(3)]))
        first[-3] ^= 0xFF  # the first chunk's payload: its checksum fails, the framing holds
        path.write_bytes(
            bytes(first) + _recordio(tmp_path / "b.recordio", [[np.array([i]), np.array([-i])] for i in range(3, 9)])
        )
        return path, {}, 3, ["slot0", "slot1"]
    with Writer(str(path), Compressor.NONE) as writer:  # one chunk; record 0 is not a sample at all
        writer.write_raw(b"\x00\x01 not a record")
        for i in range(3, 9):
            writer.write({"a": np.array([i]), "b": np.array([-i])})
    return path, {}, 1, ["a", "b"]


def _two_more(tmp_path, kind: str):
    if kind == "text":
        path = tmp_path / "part-1.txt"
        path.write_text("9 -9\n10 -10\n")
        return path
    path = tmp_path / "part-1.recordio"
    with Writer(str(path), Compressor.NONE) as writer:
        for i in (9, 10):
            pair = [np.array([i]), np.array([-i])]
            writer.write(dict(zip("ab", pair)) if kind == "record" else pair)
    return path


def numbers(line: str):
    first, second = line.split()
    return [np.array([int(first)]), np.array([int(second)])]


@pytest.mark.parametrize("group", [False, True], ids=["file", "group"])
@pytest.mark.parametrize("mapped", [False, True], ids=["blocks", "samples"])
@pytest.mark.parametrize("kind", ["chunk", "record", "text"])
def test_a_damaged_first_record_is_skipped_alone_without_fields(tmp_path, kind, mapped, group) -> None:
    # Without source.fields the worker read the first record at open for the file's names: a damaged one
    # failed the whole file as "could not be opened", one record counted and every good record lost.
    path, source, bad, names = _damaged_first(tmp_path, kind)
    pipeline = {"batch_size": 2, "on_error": "skip", "mappers": [f"{HERE}:same"] if mapped else []}
    files = [str(path)]
    if group:  # another file of the same kind after it in the lease, records 9 and 10
        files.append(str(_two_more(tmp_path, kind)))
    config = LoaderConfig.from_dict({"source": {"files": files, **source}, "pipeline": pipeline})
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=str(path), start=0, more=files[1:] or None)
    messages = [P.decode(frames) for frames in run_file_job(lease, config)]
    done = messages[-1][0]
    assert isinstance(done, P.FileDone), done
    assert (done.sent, done.skipped) == (6 + 2 * group, bad)
    chunks = [columns for _, columns in messages[:-1]]
    assert all(list(columns) == names for columns in chunks), [list(c) for c in chunks]
    assert [int(v) for columns in chunks for v in np.ravel(columns[names[0]])] == list(range(3, 9 + 2 * group))


@pytest.mark.parametrize("mapped", [False, True], ids=["blocks", "samples"])
@pytest.mark.parametrize(
    "lines, values",
    [(["bad", "1 -1", "bad", *(f"{i} {-i}" for i in range(3, 8))], [1, 3, 4, 5, 6, 7]), (["bad", "1 -1"], [1])],
    ids=["a damaged record after the first good one", "one good record"],
)
def test_the_names_after_a_damaged_first_record_come_from_the_good_one_read(tmp_path, mapped, lines, values):
    # They were taken with slot_names, which reads a record ahead where records carry no names: a damaged one
    # there failed the good record (lost, every later record numbered one too low), and at the end of the file
    # the slots went out as "0", "1".
    path = tmp_path / "part-0.txt"
    path.write_text("\n".join(lines) + "\n")
    source = {"files": [str(path)], "format": "text", "format_options": {"parser": f"{HERE}:numbers"}}
    pipeline = {"batch_size": 2, "on_error": "skip", "mappers": [f"{HERE}:same"] if mapped else []}
    config = LoaderConfig.from_dict({"source": source, "pipeline": pipeline})
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=str(path), start=0)
    messages = [P.decode(frames) for frames in run_file_job(lease, config)]
    done = messages[-1][0]
    assert (done.sent, done.skipped) == (len(values), len(lines) - len(values))
    chunks = messages[:-1]
    assert all(list(columns)[:2] == ["slot0", "slot1"] for _, columns in chunks)
    assert [int(v) for _, columns in chunks for v in np.ravel(columns["slot0"])] == values
    assert chunks[0][0].record == 1  # the good line's own number


def test_records_a_reader_steps_past_are_skipped_without_reading_the_file_again(tmp_path, monkeypatch) -> None:
    # Each bad record of a block used to reopen the file and read up to it again (a chunk inflated once per bad
    # record: 17 s for 200 of them, the worker taken for stalled).
    from workers.file_job import FileJob

    path = tmp_path / "part-0.recordio"
    with Writer(str(path), Compressor.ZLIB) as writer:  # one chunk, records 5..44 not samples at all
        for i in range(50):
            if 5 <= i < 45:
                writer.write_raw(b"\x00\x01 not a record")
            else:
                writer.write([np.array([i]), np.array([-i])])
    opened = []
    real_open = FileJob._open
    monkeypatch.setattr(FileJob, "_open", lambda job: opened.append(1) or real_open(job))
    config = LoaderConfig.from_dict({"source": {"files": [str(path)]}, "pipeline": {"on_error": "skip"}})
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=str(path), start=0)
    messages = [P.decode(frames) for frames in run_file_job(lease, config)]
    done = messages[-1][0]
    assert (done.sent, done.skipped) == (10, 40)
    assert [int(v) for _, columns in messages[:-1] for v in np.ravel(columns["slot0"])] == [*range(5), *range(45, 50)]
    assert len(opened) == 1, "read once, on past each bad record"


def test_a_file_that_cannot_be_read_past_a_record_says_the_rest_is_lost(tmp_path, caplog) -> None:
    path = tmp_path / "part-0.recordio"
    good = _recordio(tmp_path / "a.recordio", [[np.array([i]), np.array([-i])] for i in range(6)])  # chunks of 3
    damaged = bytearray(good)
    second = damaged.find(b"\x04\x03\x02\x01", 4)  # the second chunk's magic number (little-endian 0x01020304)
    assert second > 0
    damaged[second : second + 4] = b"\xef\xbe\xad\xde"  # its framing lost: nothing after it can be found
    path.write_bytes(bytes(damaged))
    config = LoaderConfig.from_dict({"source": {"files": [str(path)]}, "pipeline": {"on_error": "skip"}})
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=str(path), start=0)
    with caplog.at_level("WARNING", logger="loader.worker"):
        messages = [P.decode(frames) for frames in run_file_job(lease, config)]
    done = messages[-1][0]
    assert (done.sent, done.skipped) == (3, 1)
    lost = [r.getMessage() for r in caplog.records if "could not read" in r.getMessage()]
    assert lost == [
        f"could not read {path} past record 3: its records after it are skipped too, uncounted (how many is unknown)"
    ]
