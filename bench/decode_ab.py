"""The fused decode step's C kernels from two source trees, alternated step by step on one
runner in one process: a change of a few percent shows through a shared machine's noise.

The working tree's engine/csrc and another revision's (`--base`, any git revision) are
each compiled with the engine's own flags; the same engine (same weights, same KV pages)
then serves single-stream requests while every decode step takes the other library's
`decode_step`. Adjacent steps share the machine's state, so the median of the paired
ratios (this tree / base) is the figure; both sides' step times are printed too.

    python -m bench.decode_ab --base main --model qwen2.5-coder-0.5b
"""

import argparse
import ctypes
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from bench import engine_driver as ed


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", default="main", help="git revision whose engine/csrc is the baseline")
    p.add_argument("--model", default=common.MODEL)
    p.add_argument("--weights", default="w8a8")
    p.add_argument("--requests", type=int, default=8, help="each 64 tokens, one at a time")
    return p.parse_args()


def build(csrc: Path, out: Path) -> ctypes.CDLL:
    """engine/native.py's build of the sources in csrc, loaded with its signatures."""
    import engine.native as native

    sources = [str(csrc / s.name) for s in native.SOURCES]
    subprocess.run(["gcc", *native.build_flags("gcc"), "-o", str(out), *sources, "-lm"], check=True)
    return native.load(out)


def alternate(engine: Any, libs: dict[str, ctypes.CDLL], items: list) -> dict[str, list[float]]:
    """Serve the items one at a time, each decode step on the next library in turn."""
    fused = engine.runner.fused
    logits = fused.logits
    names, seconds = list(libs), {name: [] for name in libs}

    def timed_logits(*args: Any, **kwargs: Any) -> Any:
        name = names[sum(map(len, seconds.values())) % len(names)]
        fused.kernels = libs[name]
        start = time.perf_counter()
        out = logits(*args, **kwargs)
        seconds[name].append(time.perf_counter() - start)
        return out

    fused.logits = timed_logits
    for k, item in enumerate(items):
        engine.add_request(f"ab{k}", list(item.prompt_ids), ed.greedy(64))
        while engine.has_unfinished():
            engine.step()
    return seconds


def main() -> None:
    args = parse_args()
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", args.base, "engine/csrc"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        libs = {
            "base": build(Path(tmp) / "engine" / "csrc", Path(tmp) / "base.so"),
            "tree": build(root / "engine" / "csrc", Path(tmp) / "tree.so"),
        }
        tokenizer = common.load_tokenizer(args.model)
        items = common.sharegpt_workload(
            tokenizer, args.requests, max_prompt_tokens=256, max_output=64, seed=1
        )
        engine = ed.make_engine(
            model=args.model,
            kv_cache_bytes=4096 * ed.model_dims(args.model).kv_bytes_per_token,
            num_threads=1,
            weights=args.weights,
        )
        ed.warm_up(engine, items[0].prompt_ids)
        seconds = alternate(engine, libs, items)
    pairs = sorted(t / b for b, t in zip(seconds["base"], seconds["tree"], strict=False))
    ratio = {q: round(pairs[int(q * (len(pairs) - 1))], 4) for q in (0.25, 0.5, 0.75)}
    sides = {
        name: {"steps": len(s), "median_ms": round(1e3 * common.median(s), 3)}
        for name, s in seconds.items()
    }
    print(f"decode_step, tree / base ({args.base}): median of {len(pairs)} paired ratios")
    print(f"  {ratio[0.5]} (quartiles {ratio[0.25]}, {ratio[0.75]}); {sides}")
    result = {"base": args.base, "model": args.model, "weights": args.weights, "sides": sides}
    common.write_result(f"decode_ab_{args.model}", result | {"tree_over_base": ratio})


if __name__ == "__main__":
    main()
