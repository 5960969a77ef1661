"""sae.system.io: atomic writes leave either the new file or the old one, never a part or a temp
file."""

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sae.system import io


def leftovers(folder):
    """Temporary files left in a folder (every name but the targets')."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_text_bytes_and_png_are_written_whole_and_leave_no_temp_file(tmp_path):
    io.write_text(tmp_path / "a.txt", "λ = 0.01\n")
    io.write_bytes(tmp_path / "sub" / "b.bin", b"\x00\x01")  # parent folders are created
    rgb = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    io.write_png(tmp_path / "c.png", rgb)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "λ = 0.01\n"
    assert (tmp_path / "sub" / "b.bin").read_bytes() == b"\x00\x01"
    from PIL import Image

    with Image.open(tmp_path / "c.png") as image:
        np.testing.assert_array_equal(np.asarray(image), rgb)
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "sub") == []
    assert oct((tmp_path / "a.txt").stat().st_mode & 0o777) == oct(0o644)


def test_copy_file(tmp_path):
    (tmp_path / "src").write_bytes(b"x" * 100_000)
    assert io.copy_file(tmp_path / "src", tmp_path / "out" / "dst") == tmp_path / "out" / "dst"
    assert (tmp_path / "out" / "dst").read_bytes() == b"x" * 100_000


def test_json_non_finite_becomes_null(tmp_path):
    data = {"nan": float("nan"), "inf": [float("inf"), -math.inf, 1.5], "ok": 2,
            "np": np.float32("nan"), "arr": np.array([1.0, np.nan]), "t": (np.int64(3),)}
    path = io.write_json(tmp_path / "m.json", data)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    # a strict reader: refuses the NaN / Infinity constants Python's json writes by default
    def refuse(name):
        raise ValueError(name)

    assert json.loads(text, parse_constant=refuse) == {
        "nan": None, "inf": [None, None, 1.5], "ok": 2, "np": None, "arr": [1.0, None], "t": [3]}


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=20))
def test_finite_json_always_gives_strict_json(data):
    text = json.dumps(io.finite_json(data), allow_nan=False)  # would raise on NaN / inf
    back = json.loads(text)
    if isinstance(data, float) and math.isfinite(data):
        assert back == data


def test_failing_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "report.html"
    io.write_text(path, "old page")
    with pytest.raises(RuntimeError):
        with io.atomic_file(path, "w") as fh:
            fh.write("half a new pa")
            raise RuntimeError("disk full")
    assert path.read_text() == "old page"
    assert leftovers(tmp_path) == []


def test_unserialisable_json_touches_nothing(tmp_path):
    path = io.write_json(tmp_path / "a.json", {"v": 1})
    with pytest.raises(TypeError):
        io.write_json(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1} and leftovers(tmp_path) == []


def test_failing_replace_removes_the_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "x.bin"
    io.write_bytes(path, b"old")

    def broken_replace(src, dst):
        raise OSError("read-only file system")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        io.write_bytes(path, b"new")
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_bad_mode_is_refused(tmp_path):
    with pytest.raises(ValueError):
        with io.atomic_file(tmp_path / "x", "a"):
            pass
