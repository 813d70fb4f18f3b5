"""Convert a bundled GGUF model to a Hugging Face folder (for vLLM, which cannot read it)."""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from engine.model_registry import cache_dir, resolve_model

_DONE = ".tiergate-converted.json"


def hf_folder_path(model: str) -> Path:
    return cache_dir() / "hf" / model


def ensure_hf_folder(model: str = "smollm2-135m") -> Path:
    """Dequantise the GGUF once into fp32 safetensors plus tokenizer; later calls reuse it."""
    target = hf_folder_path(model)
    if (target / _DONE).is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = resolve_model(model).path
    start = time.perf_counter()
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype="float32", **kwargs)
    # transformers marks GGUF-loaded models as quantised and refuses to save them: copy the
    # dequantised fp32 weights into a plain model built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    net = AutoModelForCausalLM.from_config(config, dtype="float32")
    net.load_state_dict(loaded.state_dict())
    net.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _add_legacy_rope_theta(tmp / "config.json")
    seconds = time.perf_counter() - start
    (tmp / _DONE).write_text(json.dumps({"gguf": str(gguf), "seconds": round(seconds, 1)}))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)  # a killed conversion never leaves a folder that looks finished
    return target


def _add_legacy_rope_theta(path: Path) -> None:
    """transformers 5 writes rope_parameters only; older readers (vLLM's pins) want rope_theta."""
    config = json.loads(path.read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:
        config["rope_theta"] = theta
        path.write_text(json.dumps(config, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    path = ensure_hf_folder(args.model)
    print(path, (path / _DONE).read_text())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
