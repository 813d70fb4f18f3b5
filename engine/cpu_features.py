"""What this CPU's vector units can do, read once at start-up and logged once.

The C kernels are built with -march=native, but a kernel written for one instruction set
(the int8 GEMM's AVX-512 and AVX2 paths) is only called where the CPU has it. AMX tiles
also need the kernel's permission: without arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)
tile instructions die with SIGILL even where /proc/cpuinfo lists amx, so `amx` is true
only when that request succeeded.
"""

import ctypes
import functools
import logging
import platform
from pathlib import Path

log = logging.getLogger(__name__)

# feature name -> the /proc/cpuinfo flags that must all be present
_FLAGS = {
    "avx2": ("avx2",),
    "fma": ("fma",),
    "avx512f": ("avx512f",),
    "avx512bw": ("avx512bw",),
    "avx512_vnni": ("avx512_vnni",),
    "avx512_bf16": ("avx512_bf16",),
    "avx_vnni": ("avx_vnni",),
}
_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def features_from_flags(flags: set[str], amx_granted: bool) -> dict[str, bool]:
    found = {name: all(f in flags for f in need) for name, need in _FLAGS.items()}
    found["amx"] = amx_granted and {"amx_tile", "amx_int8"} <= flags
    found["amx_bf16"] = amx_granted and {"amx_tile", "amx_bf16"} <= flags
    return found


def _request_amx() -> bool:
    """Ask Linux for the AMX tile state (per process; harmless to repeat)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


@functools.cache
def cpu_features() -> dict[str, bool]:
    """{"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
    "amx" (int8 tiles), "amx_bf16"}: True where this CPU (and, for AMX, the OS) lets the
    process use it."""
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        flags = set()
    x86 = platform.machine() in ("x86_64", "AMD64")
    amx = x86 and "amx_tile" in flags and _request_amx()
    found = features_from_flags(flags if x86 else set(), amx)
    log.info("CPU features: %s", " ".join(k for k, v in found.items() if v) or "none")
    return found
