"""specjax.files: atomic writes leave the old file or the new one, and damaged JSON and
NumPy archives are refused with errors that name the file and the remedy."""

import json

import numpy as np
import pytest

from specjax.files import (
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
