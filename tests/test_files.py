"""specjax.runtime.files: atomic writes leave the old file or the new one, and damaged JSON and
NumPy archives are refused with errors that name the file and the remedy."""

import json

import numpy as np
import pytest

from specjax.runtime.files import (
    atomic_path,
    check_arrays,
    load_npz,
    read_json,
    save_npz_atomically,
    write_json_atomically,
)


def test_writes_replace_the_file_whole_and_leave_no_temporary(tmp_path):
    write_json_atomically(tmp_path / "a.json", {"x": 1})
    write_json_atomically(tmp_path / "a.json", {"x": 2})
    assert read_json(tmp_path / "a.json") == {"x": 2}
    save_npz_atomically(tmp_path / "b.npz", w=np.ones(3))
    assert load_npz(tmp_path / "b.npz")["w"].tolist() == [1, 1, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.npz"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    write_json_atomically(tmp_path / "a.json", {"x": 1})
    with pytest.raises(OSError), atomic_path(tmp_path / "a.json") as temporary:
        temporary.write_text('{"x": ')
        raise OSError("disk full")
    assert read_json(tmp_path / "a.json") == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


@pytest.mark.parametrize("text, message", [
    ('{"steps": 3, "lr"', "cut short"),
    ("[1, 2]", "holds a JSON list, expected an object"),
    ("not json", "is not valid JSON at line 1, column 1"),
])
def test_damaged_json_is_named(tmp_path, text, message):
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(ValueError, match=message) as raised:
        read_json(tmp_path / "c.json", "write it again")
    assert str(tmp_path / "c.json") in str(raised.value)
    assert "write it again" in str(raised.value)


def test_a_cut_archive_is_named_and_arrays_are_checked(tmp_path):
    save_npz_atomically(tmp_path / "d.npz", w=np.zeros((2, 3), np.float32),
                        ids=np.arange(4))
    data = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable NumPy archive"):
        load_npz(tmp_path / "cut.npz")
    arrays = load_npz(tmp_path / "d.npz")
    check_arrays(tmp_path / "d.npz", arrays, {"w": (2, 3), "ids": (4,)}, "fix",
                 floating=lambda name: name == "w")
    for expected, message in [({"w": (2, 3)}, "holds arrays this model has no place for"),
                              ({"w": (3, 2), "ids": (4,)}, "array w has shape"),
                              ({"w": (2, 3), "ids": (4,), "b": (1,)}, "lacks"),
                              ({"w": (2, 3), "ids": (4,)}, "array ids holds int")]:
        with pytest.raises(ValueError, match=message):
            check_arrays(tmp_path / "d.npz", arrays, expected, "fix")
    assert json.loads(json.dumps(sorted(arrays))) == ["ids", "w"]


@pytest.mark.parametrize("name", ["store", "store.bin", "store.npz", "a.b.c"])
def test_an_archive_is_written_at_exactly_the_given_name(tmp_path, name):
    save_npz_atomically(tmp_path / name, w=np.arange(3))
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert load_npz(tmp_path / name)["w"].tolist() == [0, 1, 2]


def test_modes_follow_the_umask_and_an_overwritten_file_keeps_its_own(tmp_path):
    import os

    old = os.umask(0o027)
    try:
        write_json_atomically(tmp_path / "new.json", {"x": 1})
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)
    shared = tmp_path / "shared.npz"
    save_npz_atomically(shared, w=np.zeros(2))
    shared.chmod(0o644)
    save_npz_atomically(shared, w=np.ones(2))
    assert shared.stat().st_mode & 0o777 == 0o644
    shared.chmod(0o600)
    write_json_atomically(shared, {"x": 2})
    assert shared.stat().st_mode & 0o777 == 0o600


def test_a_symlink_is_written_through(tmp_path):
    (tmp_path / "real").mkdir()
    write_json_atomically(tmp_path / "real" / "a.json", {"x": 1})
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "real" / "a.json")
    write_json_atomically(link, {"x": 2})
    assert link.is_symlink()
    assert read_json(tmp_path / "real" / "a.json") == {"x": 2}
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["a.json"]


def test_a_directory_or_a_missing_folder_is_refused_by_name_and_nothing_is_left(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError, match="folder is a directory"):
        save_npz_atomically(tmp_path / "folder", w=np.zeros(1))
    with pytest.raises(FileNotFoundError, match="missing.*does not exist"):
        write_json_atomically(tmp_path / "missing" / "a.json", {})
    (tmp_path / "plain").write_text("")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        write_json_atomically(tmp_path / "plain" / "a.json", {})
    with pytest.raises(TypeError):  # a value JSON cannot hold: no temporary remains
        write_json_atomically(tmp_path / "x.json", {"w": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "plain"]
    assert list((tmp_path / "folder").iterdir()) == []
