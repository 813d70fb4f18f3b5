"""Run a baseline worker (baseline_llamacpp.py, baseline_vllm.py) in its own venv.

The workers read a JSON job and print 'RESULT {json}'; this side builds the job from a
workload and turns the answer into a tokens/s result, or a {"skipped": reason}.
"""

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench import common
from bench.hf_folder import ensure_hf_folder


def run_in_venv(venv: common.Venv, script: str, job: dict[str, Any], timeout: int) -> dict:
    """Run a baseline worker in its own venv; it prints 'RESULT {json}' as its last word."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    cmd = [str(venv.python), str(Path(__file__).parent / script), f.name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"{script} ran past {timeout} s"}
    finally:
        Path(f.name).unlink(missing_ok=True)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            if "runs_seconds" in result:  # repeated: report the median run, keep them all
                runs = [{"seconds": x} for x in result.pop("runs_seconds")]
                return {**result, **common.median_run(result["output_tokens"], runs)}
            result["tokens_per_s"] = result["output_tokens"] / result["seconds"]
            return result
    tail = (done.stderr or done.stdout)[-1500:]
    return {"skipped": f"{script} failed (rc {done.returncode}): {tail}"}


def venv_or_skip(name: str, skip: bool, no_install: bool) -> common.Venv:
    if skip:
        return common.skipped_venv(name, "skipped by flag")
    marker = common.VENVS_DIR / name / ".tiergate-installed.json"
    if no_install and not marker.is_file():
        return common.skipped_venv(name, "not installed and --no-install given")
    return common.ensure_venv(name)


def job_items(items: list[common.ChatItem]) -> list[dict[str, Any]]:
    return [{"prompt_ids": i.prompt_ids, "output_tokens": i.output_tokens} for i in items]


def run_llamacpp(
    items: list[common.ChatItem], venv: common.Venv, threads: int, model: str
) -> dict[str, Any]:
    if venv.python is None:
        return {"skipped": venv.skipped}
    from engine.model_registry import resolve_model

    gguf = str(resolve_model(model).path)
    job = {"gguf": gguf, "items": job_items(items), "threads": threads}  # probes 1..threads
    return run_in_venv(venv, "baseline_llamacpp.py", job, timeout=1800)


def run_vllm(
    items: list[common.ChatItem], venv: common.Venv, threads: int, repeats: int, **job: Any
) -> dict[str, Any]:
    """job: model and dtype."""
    if venv.python is None:
        return {"skipped": venv.skipped}
    job["hf_folder"] = str(ensure_hf_folder(job.pop("model")))
    job.update(items=job_items(items), kv_gib=2, threads=threads, repeats=repeats)
    return run_in_venv(venv, "baseline_vllm.py", job, timeout=1800)
