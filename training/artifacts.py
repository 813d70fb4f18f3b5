"""Where training reads and writes, declared once, and the provenance every write records.

Inputs live in training/data. The two artefacts the gateway loads at run time stay where it
loads them (VERIFIER_MODEL, DIFFICULTY_EXAMPLES); training is their only writer, and each
write leaves a sidecar beside the artefact (`<name>.provenance.json`): the data files it was
made from with their sha256, the code's git commit, the command and its figures. Reports
(cross-validation, learning curves) go to REPORTS, with the same provenance inside.
"""

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gateway.cache.aligned_verifier import ALIGNED_MODEL as ALIGNED_ARTIFACT
from gateway.cache.nli_verifier import NLI_MODEL as NLI_ARTIFACT
from gateway.cache.pair_model import PAIR_CONFIG, PAIR_MODEL
from gateway.cache.verifier import DEFAULT_ARTIFACT

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "training" / "data"
# Overridable, as bench/results is, so a trial run keeps its reports apart (ignored by git).
REPORTS = Path(os.environ.get("TIERGATE_TRAINING_REPORTS") or ROOT / "training" / "reports")
VERIFIER_MODEL = DEFAULT_ARTIFACT  # gateway/cache/verifier_model.json
# The cross-encoder (ONNX, int8) and its thresholds; the JSON names the ONNX file's sha256.
PAIR_MODEL_ONNX = PAIR_MODEL  # gateway/cache/pair_model.onnx
PAIR_MODEL_CONFIG = PAIR_CONFIG  # gateway/cache/pair_model.json
ALIGNED_MODEL = ALIGNED_ARTIFACT  # gateway/cache/aligned_model.json
NLI_MODEL = NLI_ARTIFACT  # gateway/cache/nli_model.json
DIFFICULTY_EXAMPLES = ROOT / "router_policies" / "difficulty_examples.jsonl"
CACHE_PAIRS = DATA / "cache_pairs.jsonl"  # rule-made pairs (pairs.jsonl takes its `rules` rows)
# word statistics the vetoes and features read (document frequency, capitalisation)
CACHE_WORDS = DATA / "cache_words.json"
# Pairs written by people, with a held-out split (python -m training cache real-pairs).
REAL_PAIRS_DIR = DATA / "cache_pairs_real"
REAL_PAIRS = REAL_PAIRS_DIR / "pairs.jsonl"
# Sets written after the first models (python -m training cache later-set --set NAME): more
# train pairs, and held-out sets written after the models they judge.
REAL_PAIRS_TRAIN2 = REAL_PAIRS_DIR / "pairs_train2.jsonl"
REAL_PAIRS_HELDOUT2 = REAL_PAIRS_DIR / "pairs_heldout2.jsonl"
REAL_PAIRS_HELDOUT3 = REAL_PAIRS_DIR / "pairs_heldout3.jsonl"
REAL_PAIRS_HELDOUT4 = REAL_PAIRS_DIR / "pairs_heldout4.jsonl"
REAL_PAIRS_TRAIN3 = REAL_PAIRS_DIR / "pairs_train3.jsonl"
REAL_PAIRS_HELDOUT5 = REAL_PAIRS_DIR / "pairs_heldout5.jsonl"
REAL_PAIRS_TRAIN4 = REAL_PAIRS_DIR / "pairs_train4.jsonl"
REAL_PAIRS_HELDOUT6 = REAL_PAIRS_DIR / "pairs_heldout6.jsonl"
# Judged lookups of a crowded train scope (train side, may be fitted on; judged_rows.py).
TRAIN_JUDGED = (
    REAL_PAIRS_DIR / "populated_judged_train.jsonl",
    REAL_PAIRS_DIR / "neighbours_judged_train.jsonl",
    REAL_PAIRS_DIR / "neighbours_judged_scope.jsonl",
)
# Stored questions that no pair joins, written to make the train scope as crowded as the
# held-out one (neighbours.py; README beside them). Train side: never held-out text.
SCOPE_QUESTIONS_TRAIN = REAL_PAIRS_DIR / "scope_questions_train.txt"


def cpu_model() -> str:
    """The CPU's name as lscpu shows it (figures move 2-3x between machine types)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _relative(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def code_version() -> dict[str, Any]:
    """The checkout's commit, and whether the Python code of training, gateway or engine
    differs from it (then the commit alone does not reproduce the figures). Data and
    artefacts are not code: their sha256 is recorded instead."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    code = ("training/*.py", "gateway/*.py", "engine/*.py")
    changed = git("status", "--porcelain", "--untracked-files=all", "--", *code)
    return {"commit": commit, "dirty": None if changed is None else bool(changed)}


def provenance(data: list[Path], figures: dict[str, Any]) -> dict[str, Any]:
    """What a reader needs to trust or redo a figure or artefact: inputs, code, machine."""
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "code": code_version(),
        "data": {_relative(p): sha256_of(p) for p in data},
        "figures": figures,
        "machine": {"cpu_model": cpu_model(), "python": platform.python_version()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def sidecar_of(artifact: Path) -> Path:
    return artifact.with_name(f"{artifact.stem}.provenance.json")


def write_artifact(artifact: Path, text: str, data: list[Path], figures: dict[str, Any]) -> Path:
    """The artefact, then its sidecar (which names the artefact's own sha256)."""
    artifact.write_text(text)
    record = {"artifact": _relative(artifact), "sha256": sha256_of(artifact)}
    record |= provenance(data, figures)
    sidecar = sidecar_of(artifact)
    sidecar.write_text(json.dumps(record, indent=1) + "\n")
    return sidecar


def write_report(name: str, report: dict[str, Any], data: list[Path]) -> Path:
    """REPORTS/<name>.json: the report's figures, with their provenance under `provenance`."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    path = REPORTS / f"{name}.json"
    body = report | {"provenance": provenance(data, {})}
    path.write_text(json.dumps(body, indent=1) + "\n")
    return path
