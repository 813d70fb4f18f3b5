"""The one atomic write: a whole new file or the old one, never half, never a stray temp."""

from pathlib import Path

import pytest

from engine.cache_files import atomic_path


def test_write_lands_whole_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "model.bin"  # the folder is made on demand
    with atomic_path(target, mode=0o755) as tmp:
        assert not target.exists()  # nothing at the target until the write is complete
        Path(tmp).write_bytes(b"weights")
    assert target.read_bytes() == b"weights"
    assert target.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in target.parent.iterdir()] == ["model.bin"]


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "tokenizer.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]
