"""The engine's cache folder and the one way files land in it.

Converted weights, tokenizers, assembled models and compiled kernels live under
cache_dir() (~/.cache/tiergate; TIERGATE_CACHE_DIR moves it). Every file is written beside
its target and renamed over it in one step, so a reader (or a concurrent writer) sees the
old file or the whole new one, never half of one.
"""

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_CACHE_VERSION = "2"  # bump when a converted file's layout changes


def cache_dir() -> Path:
    root = os.environ.get("TIERGATE_CACHE_DIR") or Path.home() / ".cache" / "tiergate"
    return Path(root)


def cache_path(source: Path, kind: str, suffix: str) -> Path:
    """A cache file for data converted from `source`; changes when the source does."""
    st = source.stat()
    key = f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}:{_CACHE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / kind / f"{source.stem}-{digest}{suffix}"


@contextmanager
def atomic_path(target: Path, mode: int = 0o644) -> Iterator[str]:
    """A temporary path beside target to write; on a clean exit it gets `mode` and
    replaces target at once, on an error it is removed and target is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)  # mkstemp makes it owner-only; nothing cached here is secret
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
