"""File rows: layouts come from the file's own header, rows are bounds-checked, a changed file is refused."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from loader.service.shm import file_rows as F
from loader.service.shm import refs as R

ROWS, WIDTH = 12, 20_000  # 80 KiB float32 rows


def _rows() -> np.ndarray:
    values = np.random.default_rng(0).random((ROWS, WIDTH), dtype=np.float32)
    values[:, 0] = np.arange(ROWS)
    return values


def _gather(table: F.FileTable, ref_id: int, rows: list[int], spec: tuple[str, tuple[int, ...]]) -> np.ndarray:
    refs = np.array([[ref_id, r, 0] for r in rows], dtype=np.int64)
    return R.gather(refs, {0: spec}, table.get, free=False)


def _save_v3(path, values: np.ndarray) -> None:
    """np.save writes format 3.0 only when a field name needs UTF-8: written as such here (np.load reads it)."""
    with open(path, "wb") as fh:
        np.lib.format.write_array(fh, values, version=(3, 0))


@pytest.mark.parametrize("kind", ["npy", "npy 3.0", "companion", "npz"])
def test_rows_read_by_reference_equal_the_file(tmp_path, kind):
    values = _rows()
    path, member = str(tmp_path / "a.npy"), "data"
    if kind == "npy":
        np.save(path, values)
    elif kind == "npy 3.0":  # was "unsupported .npy format version (3, 0)", and the chunk lost on the way
        _save_v3(path, values)
        assert np.array_equal(np.load(path), values)
    elif kind == "companion":
        np.save(path, np.arange(ROWS))
        np.save(tmp_path / "a.pixels.npy", values)
        member = "pixels"
    else:
        path, member = str(tmp_path / "a.npz"), "x"
        np.savez(path, label=np.arange(ROWS), x=values)
    table = F.FileTable()
    ref_id, layout = table.resolve(path, member)
    assert layout.spec == ("<f4", (WIDTH,)) and layout.rows == ROWS
    assert table.resolve(path, member)[0] == ref_id, "an unchanged file keeps its source"
    order = [3, 4, 5, 0, 11, 7, 8]  # runs of consecutive rows are read at once
    got = _gather(table, ref_id, order, layout.spec)
    assert np.array_equal(got, values[order]) and got.flags.c_contiguous and got.flags.writeable
    table.close()


def _save_encrypted(path: str) -> None:
    """An .npz whose member says it is encrypted (zipfile then raised its own RuntimeError, not a FileRowsError)."""
    np.savez(path[:-4] + ".npz", x=np.zeros((2, 4)))
    raw = bytearray(open(path[:-4] + ".npz", "rb").read())
    raw[raw.find(b"PK\x03\x04") + 6] |= 1  # general purpose flag bit 0, in the local header and the directory
    raw[raw.find(b"PK\x01\x02") + 8] |= 1
    open(path[:-4] + ".npz", "wb").write(raw)


@pytest.mark.parametrize(
    "write, why",
    [
        (lambda p: np.savez_compressed(p[:-4] + ".npz", x=np.zeros((2, 4))), "compressed"),
        (_save_encrypted, "encrypted"),
        (lambda p: np.save(p, np.asfortranarray(np.zeros((4, 3)))), "C-order"),
        (lambda p: np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True), "object|dtype"),
        (lambda p: open(p, "wb").write(b"not an array"), "no readable array"),
    ],
)
def test_what_is_not_rows_of_a_plain_array_is_refused(tmp_path, write, why):
    path = str(tmp_path / "a.npy")
    write(path)
    target, member = (path[:-4] + ".npz", "x") if os.path.exists(path[:-4] + ".npz") else (path, "data")
    with pytest.raises(F.FileRowsError, match=why):
        F.FileTable().resolve(target, member)


def test_members_name_no_other_file(tmp_path):
    np.save(tmp_path / "a.npy", _rows())
    for member in ["../a", "x/../../etc", "", ".hidden"]:
        with pytest.raises(F.FileRowsError):
            F.member_file(str(tmp_path / "a.npy"), member)
    with pytest.raises(F.FileRowsError, match="not an .npy or .npz"):
        F.member_file("/etc/passwd", "data")


def test_a_short_file_is_refused_before_any_read(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, _rows())
    os.truncate(path, os.path.getsize(path) - 100)
    with pytest.raises(F.FileRowsError, match="shorter"):
        F.FileTable().resolve(str(path), "data")


def test_an_npz_member_claiming_more_rows_than_it_holds_is_refused(tmp_path):
    # Its rows would run into the next member's bytes: the bound is the member's end, not the file's.
    path = tmp_path / "a.npz"
    np.savez(path, data=np.ones((4, WIDTH), np.float32), other=np.zeros((64, WIDTH), np.float32))
    raw = path.read_bytes()
    claim = f"'shape': (4, {WIDTH})".encode()
    assert raw.count(claim) == 1
    path.write_bytes(raw.replace(claim, f"'shape': (8, {WIDTH})".encode()))
    with pytest.raises(F.FileRowsError, match="member 'data' is shorter than its header says"):
        F.FileTable().resolve(str(path), "data")


def test_a_fifo_in_place_of_a_file_is_refused_without_waiting_for_a_writer(tmp_path):
    # A data file replaced by a FIFO (or a companion name that is one): opening it for reading would
    # wait for a writer forever, and the stage resolves file rows on the daemon's loop thread.
    np.save(tmp_path / "a.npy", _rows())
    os.mkfifo(tmp_path / "a.pixels.npy")
    os.mkfifo(tmp_path / "b.npy")
    outcome: list[BaseException] = []

    def resolve() -> None:
        for path, member in [("a.npy", "pixels"), ("b.npy", "data")]:
            try:
                F.FileTable().resolve(str(tmp_path / path), member)
            except F.FileRowsError as exc:
                outcome.append(exc)

    thread = threading.Thread(target=resolve, daemon=True)
    thread.start()
    thread.join(5.0)
    assert not thread.is_alive(), "opening a FIFO for its rows blocked"
    assert len(outcome) == 2 and all("not a regular file" in str(e) for e in outcome), outcome


def test_rows_outside_the_file_and_wrong_row_sizes_are_refused(tmp_path):
    path = str(tmp_path / "a.npy")
    np.save(path, _rows())
    table = F.FileTable()
    ref_id, layout = table.resolve(path, "data")
    # Refused before the batch is allocated (a claimed row size is only a number until checked).
    with pytest.raises(F.FileRowsError, match=f"row {ROWS} is outside its {ROWS} rows"):
        _gather(table, ref_id, [ROWS], layout.spec)
    with pytest.raises(F.FileRowsError, match=f"row -1 is outside its {ROWS} rows"):
        _gather(table, ref_id, [-1], layout.spec)
    with pytest.raises(F.FileRowsError, match=f"claims rows of {(WIDTH + 1) * 4} bytes"):
        _gather(table, ref_id, [0], ("<f4", (WIDTH + 1,)))
    with pytest.raises(F.FileRowsError, match="claims rows of"):  # terabytes claimed: no MemoryError
        _gather(table, ref_id, [0], ("<f8", (1 << 20, 1 << 20)))
    table.close()


def test_a_changed_file_is_refused_with_one_clear_error(tmp_path):
    path = str(tmp_path / "a.npy")
    np.save(path, _rows())
    table = F.FileTable()
    ref_id, layout = table.resolve(path, "data")
    described = layout.describe()
    readers = F.RowFiles()
    opened = readers.open(described)
    with open(path, "ab") as fh:  # in place: same inode, another size and mtime
        fh.write(b"\0" * 8)
    out = np.empty((1, layout.row_bytes), np.uint8)
    with pytest.raises(F.FileRowsError, match="changed"):
        opened.read_rows(0, 1, out, layout.row_bytes)
    with pytest.raises(F.FileRowsError, match="changed"):
        F.RowFiles().open(described)
    new_id, _ = table.resolve(path, "data")
    assert new_id != ref_id, "the stage's next chunk names the file as it is now"
    readers.close()
    table.close()


def test_a_read_the_system_refuses_is_an_error_of_that_file(tmp_path, monkeypatch):
    # EIO, or ESTALE once a dataset on NFS is replaced: the file's fault, as a change is. Raw, the OSError ended
    # the client as a bad batch of its daemon's; a FileRowsError fails that epoch, naming the file.
    import errno

    path = str(tmp_path / "a.npy")
    np.save(path, _rows())
    table = F.FileTable()
    _, layout = table.resolve(path, "data")
    readers = F.RowFiles()
    opened = readers.open(layout.describe())

    def refused(*args):
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

    monkeypatch.setattr(F.os, "preadv", refused)
    out = np.empty((1, layout.row_bytes), np.uint8)
    with pytest.raises(F.FileRowsError, match=f"^{path}: its rows cannot be read: "):
        opened.read_rows(0, 1, out, layout.row_bytes)
    readers.close()
    table.close()


def test_readers_keep_a_bounded_number_of_files_open(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "MAX_OPEN_FILES", 3)
    readers, table = F.RowFiles(), F.FileTable()
    for i in range(6):
        np.save(tmp_path / f"f{i}.npy", _rows()[:2])
        readers.open(table.resolve(str(tmp_path / f"f{i}.npy"), "data")[1].describe())
    assert len(readers._open) == 3
    readers.evict_idle(time.monotonic() + F.OPEN_FILE_IDLE_S)
    assert not readers._open, "files nobody read for a while are closed"
    readers.close()


def test_sources_no_row_names_are_forgotten(tmp_path):
    table = F.FileTable()
    ids = []
    for i in range(3):
        np.save(tmp_path / f"f{i}.npy", _rows()[:2])
        ids.append(table.resolve(str(tmp_path / f"f{i}.npy"), "data")[0])
    table.keep_only({ids[1]})
    assert list(table.sources) == [F.source_of(ids[1])]
    with pytest.raises(F.FileRowsError):
        table.get(ids[0])
