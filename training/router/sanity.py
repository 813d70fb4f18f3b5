"""The sanity set: obvious easy/hard prompt pairs across domains, written by hand by this
team (tests/data/router_sanity_pairs.txt), never read by training. A difficulty score worth
shipping ranks the hard prompt of (nearly) every pair above the easy one."""

from collections.abc import Callable
from pathlib import Path

SANITY_PAIRS = Path(__file__).resolve().parents[2] / "tests" / "data" / "router_sanity_pairs.txt"


def read_pairs(path: Path = SANITY_PAIRS) -> list[tuple[str, str, str]]:
    """(domain, easy, hard) per `easy | hard` line; `## name` starts a domain."""
    pairs, domain = [], ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("## "):
            domain = line[3:].strip()
        elif line.strip() and not line.startswith("#"):
            parts = [p.strip() for p in line.split(" | ")]
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"{path.name}:{n}: expected `easy | hard`: {line!r}")
            pairs.append((domain, parts[0], parts[1]))
    return pairs


def sanity(score: Callable[[list[str]], list[float]], pairs: list[tuple[str, str, str]]) -> dict:
    """The share of pairs whose hard prompt scores higher, and the pairs that do not."""
    easy = score([e for _, e, _ in pairs])
    hard = score([h for _, _, h in pairs])
    wrong = [
        {"domain": d, "easy": e, "hard": h, "scores": [round(a, 4), round(b, 4)]}
        for (d, e, h), a, b in zip(pairs, easy, hard, strict=True)
        if b <= a
    ]
    return {
        "pairs": len(pairs),
        "hard_higher": round(1 - len(wrong) / len(pairs), 4),
        "wrong": wrong,
    }
