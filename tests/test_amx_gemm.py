"""Our AMX tile kernels for w8a8 and bf16 (engine/csrc/gemm_amx.c, engine/quantization/amx.py):
they build (tile code where the compiler takes the AMX flags, a stub elsewhere), match the
reference and the AVX-512 paths on a CPU with AMX (and on plain-C emulated tiles
anywhere), and are never chosen without AMX. The real-tile tests skip on CPUs without AMX
(or without the kernel's tile permission)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from engine import native
from engine.cpu_features import cpu_features
from engine.ops import NativeOps
from engine.quantization import amx
from engine.quantization.packing import bf16_panels
from engine.quantization.quant import quantize_w8a8, w8a8_reference

CC = shutil.which("cc") or shutil.which("gcc")
needs_amx = pytest.mark.skipif(
    not cpu_features()["amx"], reason="no AMX here (or Linux refused the tile state)"
)
needs_amx_bf16 = pytest.mark.skipif(
    not cpu_features()["amx_bf16"], reason="no AMX-BF16 here (or Linux refused the tile state)"
)


def _kernels():
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return kernels


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("tiles", [True, False])
def test_the_kernel_source_builds_with_and_without_tiles(tiles: bool, tmp_path: Path) -> None:
    if tiles and not native.accepts_amx(CC):
        pytest.skip(f"{CC} does not take {' '.join(native.AMX_FLAGS[:2])}")
    flags = list(native.AMX_FLAGS) if tiles else []
    cmd = [CC, "-O2", "-march=x86-64", "-fopenmp", "-std=gnu11", "-Werror", "-Wall", *flags]
    out = tmp_path / "amx.o"
    done = subprocess.run([*cmd, "-c", str(native.CSRC / "gemm_amx.c"), "-o", str(out)])
    assert done.returncode == 0
    dump = subprocess.run(["objdump", "-d", str(out)], capture_output=True, text=True)
    if dump.returncode == 0:  # binutils here: the tile multiply is in the code, or not
        assert ("tdpbssd" in dump.stdout) == ("tdpbf16ps" in dump.stdout) == tiles


def test_the_library_says_whether_it_has_tiles() -> None:
    assert amx.compiled(_kernels()) == native.accepts_amx(CC)


@pytest.mark.skipif(cpu_features()["amx"], reason="this CPU has AMX")
def test_without_amx_w8a8_never_takes_the_tiles() -> None:
    kernels = _kernels()
    assert not amx.tiles_usable(kernels)
    assert NativeOps(kernels, "w8a8").w8a8_path != "amx"
    assert NativeOps(kernels, "blocks").methods["blocks"].path != "amx"
    assert not amx.bf16_tiles_usable(kernels)
    assert NativeOps(kernels, "bf16").bf16_path != "amx"


@needs_amx
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_tiles_match_the_reference_and_vnni(rows: int, bias: bool) -> None:
    kernels = _kernels()
    assert amx.compiled(kernels), "AMX CPU: the compiler must take the AMX flags here"
    gen = torch.Generator().manual_seed(rows)
    n, k = 96, 224
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    x[:, 7] *= 50  # an outlier channel: only its own group's scale grows
    b = torch.randn(n, generator=gen) if bias else None
    ops = NativeOps(kernels, "w8a8", w8a8_path="amx")
    packed = ops.pack_weight(weight, rows)
    got = ops.linear(x, packed, b)
    torch.testing.assert_close(got, w8a8_reference(x, packed, b), rtol=1e-5, atol=2e-4)
    vnni = NativeOps(kernels, "w8a8", w8a8_path="vnni")
    assert torch.equal(got, vnni.linear(x, packed, b))  # the same sums in the same order


@needs_amx
def test_with_amx_w8a8_takes_the_tiles() -> None:
    kernels = _kernels()
    assert amx.tiles_usable(kernels)  # built and checked against VNNI at first use
    assert NativeOps(kernels, "w8a8").w8a8_path == "amx"
    w = quantize_w8a8(torch.randn(64, 64), panels=True)
    x = torch.randn(3, 64)
    torch.testing.assert_close(amx.gemm(kernels, x, w, "amx"), w8a8_reference(x, w, None))


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory):
    """The kernels with gemm_amx.c on tests/amx_emulate.h's plain-C tile instructions."""
    if CC is None:
        pytest.skip("no C compiler")
    if not cpu_features()["avx512f"]:
        # only the tile instructions are emulated: the code around them (gemm_amx.c's
        # TILES target) is AVX-512F, a SIGILL on an AVX2-only CPU
        pytest.skip("no AVX-512F here: the emulated tiles' surrounding code needs it")
    out = tmp_path_factory.mktemp("amx") / "emulated.so"
    emulate = ["-DTIERGATE_AMX", "-DTIERGATE_AMX_EMULATE", f"-I{Path(__file__).parent}"]
    cmd = [CC, *native.FLAGS, *emulate, "-o", str(out), *map(str, native.SOURCES), "-lm"]
    subprocess.run(cmd, check=True)
    return native.load(out)


@pytest.mark.parametrize("rows", [1, 16, 17, 40])
def test_emulated_tiles_give_the_vnni_paths_bits(rows: int, emulated) -> None:
    """Without AMX: the emulated tiles check gemm_amx.c's layouts, tile shapes and row
    padding against the other paths (the real instructions run in
    test_tiles_match_the_reference_and_vnni, on AMX CPUs)."""
    kernels = emulated
    assert amx.compiled(kernels)
    gen = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(64, 96, generator=gen), torch.randn(rows, 96, generator=gen)
    x[:, 7] *= 50
    w = quantize_w8a8(weight, panels=True)
    got = amx.gemm(kernels, x, w, "amx")
    torch.testing.assert_close(got, w8a8_reference(x, w, None), rtol=1e-5, atol=2e-4)
    if cpu_features()["avx512_vnni"]:
        assert torch.equal(got, amx.gemm(kernels, x, w, "vnni"))


def _bf16_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    return torch.nn.functional.linear(x.bfloat16().float(), weight.bfloat16().float(), bias)


@pytest.mark.parametrize("rows", [1, 16, 17, 40])
def test_emulated_bf16_tiles_match_the_avx512_bf16_path(rows: int, emulated) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(64, 96, generator=gen), torch.randn(rows, 96, generator=gen)
    b = torch.randn(64, generator=gen)
    w = bf16_panels(weight)
    got = amx.bf16_gemm(emulated, x, w, "amx") + b
    torch.testing.assert_close(got, _bf16_reference(x, weight, b), rtol=1e-5, atol=1e-4)
    if cpu_features()["avx512_bf16"]:
        vector = amx.bf16_gemm(emulated, x, w, "avx512_bf16") + b
        torch.testing.assert_close(got, vector, rtol=1e-5, atol=1e-4)


def test_bf16_tiles_leave_a_k_of_no_32_multiple_to_avx512_bf16(emulated) -> None:
    if not cpu_features()["avx512_bf16"]:
        pytest.skip("no AVX512-BF16 here: the path it falls back to")
    weight, x = torch.randn(64, 34), torch.randn(5, 34)
    w = bf16_panels(weight)
    assert torch.equal(
        amx.bf16_gemm(emulated, x, w, "amx"), amx.bf16_gemm(emulated, x, w, "avx512_bf16")
    )


@needs_amx_bf16
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
def test_bf16_tiles_match_the_reference(rows: int) -> None:
    kernels = _kernels()
    assert amx.compiled(kernels) and amx.bf16_tiles_usable(kernels)
    assert NativeOps(kernels, "bf16").bf16_path == "amx"
    gen = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(96, 224, generator=gen), torch.randn(rows, 224, generator=gen)
    b = torch.randn(96, generator=gen)
    ops = NativeOps(kernels, "bf16", bf16_path="amx")
    got = ops.linear(x, ops.pack_weight(weight, rows), b)
    torch.testing.assert_close(got, _bf16_reference(x, weight, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", ["int8", "bf16"])
def test_the_tile_check_runs_in_a_child_that_may_fault(kind: str, caplog) -> None:
    """The first tile instructions run in a child process: here without AMX they fault or
    fail there, and this process lives on without the tiles; with AMX the child agrees."""
    amx._survives_in_child.cache_clear()
    feature = "amx" if kind == "int8" else "amx_bf16"
    assert amx._survives_in_child(kind) is cpu_features()[feature]
    if not cpu_features()[feature]:
        assert "failed in a child process" in caplog.text
