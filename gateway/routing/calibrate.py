"""`tiergate calibrate`: the score threshold that sends a chosen share of traffic up a tier.

RouteLLM's way: score a sample of real prompts and take the quantile. The threshold is
written into the policy text in place (comments and layout kept), at the first rule of the
route that sends prompts with `min_score` to the chosen tier.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from gateway.policy import Policy
from gateway.routing.difficulty import build_scorer, embeddings_of, example_signals


@dataclass(frozen=True)
class Calibration:
    threshold: float
    share: float  # the share of the sample at or above the threshold
    prompts: int


def read_prompts(path: Path) -> list[str]:
    """JSONL with a "prompt" per line (labels are ignored), or plain text, a prompt a line."""
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            prompts.append(str(json.loads(line)["prompt"]))
        else:
            prompts.append(line)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def score_prompts(policy: Policy, prompts: list[str], embed_many) -> np.ndarray:
    scorer = build_scorer(policy, embed_many)
    if scorer.needs_embedding:
        embeddings = embeddings_of(prompts, policy.embedder.model, embed_many)
    else:
        embeddings = [None] * len(prompts)
    pairs = zip(embeddings, prompts, strict=True)
    return np.array([scorer.score_embedded(e, example_signals(p), p).score for e, p in pairs])


def threshold_for_share(scores: np.ndarray, share: float) -> Calibration:
    """Halfway between the k-th and (k+1)-th highest scores, k = share of the sample, so
    exactly k prompts score at or above it (ties aside)."""
    ranked = np.sort(scores)[::-1]
    k = round(share * len(ranked))
    if k <= 0:
        threshold = min(1.0, float(ranked[0]) + 1e-6)
    elif k >= len(ranked):
        threshold = float(ranked[-1])
    else:
        threshold = (float(ranked[k - 1]) + float(ranked[k])) / 2
    threshold = round(threshold, 6)
    return Calibration(threshold, float((scores >= threshold).mean()), len(scores))


def score_rule_index(policy: Policy, route: str, tier: str) -> int:
    rules = policy.routes[route].rules
    for i, rule in enumerate(rules):
        if rule.tier == tier and rule.min_score is not None:
            return i
    raise ValueError(f"routes.{route} has no rule sending min_score to tier {tier!r}")


def write_threshold(path: Path, route: str, rule_index: int, threshold: float) -> None:
    """Replace the min_score value in the file's text, leaving everything else as it is."""
    text = path.read_text()
    node = _value_node(yaml.compose(text, Loader=yaml.SafeLoader), route, rule_index)
    start, end = node.start_mark.index, node.end_mark.index
    path.write_text(text[:start] + str(threshold) + text[end:])


def _value_node(root: yaml.Node, route: str, rule_index: int) -> yaml.Node:
    node = root
    for key in ("routes", route, "rules", rule_index, "min_score"):
        if isinstance(key, int):
            node = node.value[key]
            continue
        node = next(v for k, v in node.value if k.value == key)
    return node
