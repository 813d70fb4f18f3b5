"""The engine's C kernels (engine/csrc): compiled once per machine, loaded with ctypes.

They are built with the system C compiler on first use into the cache folder, keyed by
the source, the flags and the CPU (the code is built for this CPU's vector units), and
loaded after torch so their OpenMP loops share torch's thread pool. Without a compiler,
or with TIERGATE_NATIVE=0, `kernels()` returns None and the engine uses its torch path.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch  # noqa: F401  (loaded first: the kernels then bind to torch's libgomp)

from engine.cache_files import atomic_path, cache_dir

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
_C_FILES = (
    "paged_attention.c",
    "paged_attention_bf16.c",
    "paged_attention_int8.c",
    "layer_ops.c",
    "gemm.c",
    "gemm_int8.c",
    "gemm_w8a8.c",
    "gemm_blocks.c",
    "gemm_bf16.c",
    "gemm_amx.c",
    "decode_step.c",
)
SOURCES = tuple(CSRC / f for f in _C_FILES)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
# gemm_amx.c's tile code, where the compiler takes these (it emits AMX only from the
# intrinsics, so they are safe on CPUs without it); elsewhere it builds as a stub
AMX_FLAGS = ("-mamx-tile", "-mamx-int8", "-mamx-bf16", "-DTIERGATE_AMX")

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_SIGNATURES = {
    "paged_decode_attention": [_ptr, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _ptr]
    + [_i64] * 5
    + [_f32],
    "paged_decode_attention_bf16": [_ptr, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _ptr]
    + [_i64] * 5
    + [_f32],
    "paged_decode_attention_int8": [_ptr, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _ptr]
    + [_i64] * 5
    + [_f32],
    "add_rms_norm": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32],
    "silu_mul": [_ptr, _ptr, _i64, _i64],
    "decode_step": [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr],
    "gemm_panels": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64],
    "gemm_int8_panels": [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "gemm_w8a8_panels": [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "gemm_blocks": [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "gemm_bf16_panels": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "w8a8_amx_compiled": [],
    "rope_store_kv": [_ptr, _ptr, _ptr] + [_i64] * 4 + [_ptr, _ptr, _i64, _i64, _ptr, _ptr, _i64],
}
# these return 0, or 1: out of memory
_RETURNS_STATUS = {
    "paged_decode_attention_bf16",
    "paged_decode_attention_int8",
    "paged_decode_attention",
    "decode_step",
    "gemm_int8_panels",
    "gemm_w8a8_panels",
    "gemm_bf16_panels",
    "gemm_blocks",
    "w8a8_amx_compiled",
}


def enabled() -> bool:
    return os.environ.get("TIERGATE_NATIVE", "1") != "0"


@functools.cache
def kernels() -> ctypes.CDLL | None:
    """The loaded library, or None (no compiler, build failed, or disabled)."""
    if not enabled():
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: the engine runs its slower torch attention path")
        return None
    try:
        return load(_build(compiler))
    except subprocess.CalledProcessError as exc:
        log.warning("building the engine's C kernels failed: using the torch path\n%s", exc.stderr)
        return None
    except OSError as exc:
        log.warning("the engine's C kernels are unavailable (%s): using the torch path", exc)
        return None


def load(path: Path) -> ctypes.CDLL:
    """A build of the kernels (this one, or a bench's or test's own), with its signatures."""
    lib = ctypes.CDLL(str(path))
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int if name in _RETURNS_STATUS else None
    return lib


@functools.cache
def accepts_amx(compiler: str) -> bool:
    """Whether the compiler builds AMX intrinsics (gcc 11+, clang 12+ on x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    probe = "#include <immintrin.h>\nvoid f(void) { _tile_dpbf16ps(0, 1, 2); _tile_release(); }\n"
    cmd = [compiler, *AMX_FLAGS[:3], "-x", "c", "-c", "-o", os.devnull, "-"]
    try:
        return subprocess.run(cmd, input=probe, capture_output=True, text=True).returncode == 0
    except OSError:
        return False


def build_flags(compiler: str) -> tuple[str, ...]:
    return (*FLAGS, *AMX_FLAGS) if accepts_amx(compiler) else FLAGS


def _build(compiler: str) -> Path:
    flags = build_flags(compiler)
    key = hashlib.sha256()
    for src in sorted(CSRC.iterdir()):  # sources and headers
        key.update(src.name.encode() + src.read_bytes())
    key.update(" ".join((compiler, *flags, cpu_signature())).encode())
    target = cache_dir() / "kernels" / f"tiergate_{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    with atomic_path(target, mode=0o755) as tmp:  # concurrent builders each land a whole file
        cmd = [compiler, *flags, "-o", tmp, *map(str, SOURCES), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return target


def cpu_signature() -> str:
    """-march=native code runs only on CPUs with the same vector units."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "|".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))
