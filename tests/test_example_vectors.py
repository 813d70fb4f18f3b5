"""The difficulty examples' vectors kept on disk per text: a longer examples file embeds
only its new prompts, and a torn or damaged store is embedded again, never misread."""

from pathlib import Path

import numpy as np

from gateway.routing import example_vectors
from gateway.routing.example_vectors import cached_vectors


class CountingEmbed:
    """A deterministic stand-in embedder that records what it was asked to embed."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.asked += texts
        return np.array([[len(t), sum(map(ord, t)) % 97, 1.0] for t in texts], dtype=np.float32)


def test_only_new_prompts_are_embedded(tmp_path: Path) -> None:
    embed = CountingEmbed()
    first = cached_vectors(["a", "bb", "ccc"], tmp_path, embed)
    assert embed.asked == ["a", "bb", "ccc"]
    again = cached_vectors(["ccc", "dddd", "a", "dddd"], tmp_path, embed)
    assert embed.asked == ["a", "bb", "ccc", "dddd"]  # "dddd" once, though listed twice
    assert np.array_equal(again[0], first[2]) and np.array_equal(again[2], first[0])
    assert np.array_equal(again[1], again[3]) and again[1][0] == 4


def test_a_torn_store_is_embedded_again(tmp_path: Path) -> None:
    embed = CountingEmbed()
    cached_vectors(["a", "bb"], tmp_path, embed)
    (tmp_path / "keys.json").write_text('["only-one-key"]')  # the vectors say two rows
    vectors = cached_vectors(["a", "bb"], tmp_path, embed)
    assert embed.asked == ["a", "bb", "a", "bb"] and vectors.shape == (2, 3)
    (tmp_path / "vectors.npy").write_bytes(b"not numpy")
    assert cached_vectors(["a"], tmp_path, embed)[0][0] == 1
    assert cached_vectors(["a"], tmp_path, embed)[0][0] == 1 and embed.asked.count("a") == 3


def test_past_the_cap_the_store_keeps_the_current_prompts(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(example_vectors, "MAX_ROWS", 3)
    embed = CountingEmbed()
    cached_vectors(["a", "b", "c"], tmp_path, embed)
    cached_vectors(["d", "e"], tmp_path, embed)
    keys, vectors = example_vectors.load(tmp_path)
    assert len(keys) == 2 and vectors.shape == (2, 3)
    assert cached_vectors(["d", "e"], tmp_path, embed).shape == (2, 3)
    assert embed.asked == ["a", "b", "c", "d", "e"]
