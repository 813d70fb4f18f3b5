"""Give a verifier artifact the one-candidate thresholds its own fit picked, where it was
fitted before the trainer wrote them (2026-12-07):

    python -m training cache one-candidate [ARTIFACT ...]   # default: the three shipped

`python -m training cache verifier|aligned|nli` picks two sets of thresholds out of fold:
pair by pair on the people's train pairs (`thresholds_per_pair` in the sidecar's figures)
and per lookup on the crowded train scope (`thresholds`, never below the first). Since
2026-12-07 the artifact carries the first as `thresholds_one_candidate`, for a lookup that
meets one stored question (gateway/cache/verdicts.py). An artifact fitted before that gets
them here from its own sidecar, so the model and its lookup thresholds stay as fitted; the
sidecar keeps its fit's provenance and records this amendment under `amended`.
"""

import argparse
import json
from pathlib import Path

from gateway.cache.verifier import ONE_CANDIDATE, STRICTNESS
from training.artifacts import (
    ALIGNED_MODEL,
    NLI_MODEL,
    VERIFIER_MODEL,
    code_version,
    sha256_of,
    sidecar_of,
)

SHIPPED = (VERIFIER_MODEL, ALIGNED_MODEL, NLI_MODEL)


def amend(artifact: Path) -> dict[str, float]:
    """Write the sidecar's out-of-fold per-pair thresholds into `artifact`; returns them."""
    sidecar_path = sidecar_of(artifact)
    sidecar = json.loads(sidecar_path.read_text())
    if sidecar["sha256"] != sha256_of(artifact):
        raise ValueError(f"{artifact.name} is not the artifact its sidecar describes")
    per_pair = sidecar["figures"]["thresholds_per_pair"]
    model = json.loads(artifact.read_text())
    lookup = model["thresholds"]
    if any(per_pair[name] > lookup[name] for name in STRICTNESS):
        raise ValueError(f"{artifact.name}: a per-pair threshold above its lookup one")
    model[ONE_CANDIDATE] = {name: per_pair[name] for name in STRICTNESS}
    artifact.write_text(json.dumps(model, separators=(",", ":")) + "\n")
    sidecar["sha256"] = sha256_of(artifact)
    sidecar["amended"] = {
        "command": "python -m training cache one-candidate",
        "code": code_version(),
        "what": f"{ONE_CANDIDATE} from figures.thresholds_per_pair (the same fit, out of fold)",
    }
    sidecar_path.write_text(json.dumps(sidecar, indent=1) + "\n")
    return model[ONE_CANDIDATE]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training cache one-candidate")
    p.add_argument("artifacts", nargs="*", type=Path, default=list(SHIPPED))
    args = p.parse_args(argv)
    for artifact in args.artifacts:
        if ONE_CANDIDATE in json.loads(artifact.read_text()):
            print(f"{artifact.name}: has {ONE_CANDIDATE} already")
            continue
        print(f"{artifact.name}: {amend(artifact)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
