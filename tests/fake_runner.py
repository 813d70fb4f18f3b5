"""A tiny stand-in for ModelRunner that really reads and writes a paged "KV cache".

Each KV slot stores the token written there; sampling reads the whole sequence back through
the page table, so a wrong page table, an overwritten shared page or a lost token changes
the output. The "model" picks the next token from a hash of everything it read.
"""

import time
from dataclasses import dataclass, field

import torch

from engine.batch import SeqChunk

EOS = 256
MULTI = {257: "ab", 258: "c\n", 259: "STOP", 260: " end"}  # multi-character tokens


class FakeTokenizer:
    """Byte-level: ids 0..255 are UTF-8 bytes, 256 is EOS, 257+ are multi-character pieces."""

    eos_token_ids = (EOS,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        out, buf = [], bytearray()
        for t in ids:
            if t < 256:
                buf.append(t)
                continue
            out.append(buf.decode(errors="replace"))
            buf = bytearray()
            out.append(MULTI.get(t, "" if t == EOS else "?"))
        out.append(buf.decode(errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: object = None
    ) -> str:
        turns = "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in messages)
        return turns + ("<assistant>" if add_generation_prompt else "")


@dataclass
class FakeModelConfig:
    vocab_size: int = 261


@dataclass
class FakeRunner:
    num_pages: int = 64
    page_size: int = 4
    max_model_len: int = 256
    model_name: str = "fake"
    scripts: dict[tuple[int, ...], list[int]] = field(default_factory=dict)  # prompt -> outputs
    fail_after: int | None = None  # raise after this many execute() calls
    delay: float = 0.0  # seconds per execute(), to keep requests in flight in async tests

    def __post_init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_config = FakeModelConfig()
        self.kv: list[list[int | None]] = [[None] * self.page_size for _ in range(self.num_pages)]
        self.calls: list[list[SeqChunk]] = []
        self.computed_tokens = 0

    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("fake runner failure")
        self.calls.append(chunks)
        time.sleep(self.delay)
        for c in chunks:  # write every chunk first, like one batched forward
            assert len(c.page_table) * self.page_size >= c.start_pos + len(c.token_ids)
            assert (
                len(c.page_table) * self.page_size < c.start_pos + len(c.token_ids) + self.page_size
            )
            for i, t in enumerate(c.token_ids):
                page, slot = divmod(c.start_pos + i, self.page_size)
                self.kv[c.page_table[page]][slot] = t
            self.computed_tokens += len(c.token_ids)
        return [self._sample(c) if c.sample else None for c in chunks]

    def _read(self, c: SeqChunk) -> list[int]:
        n = c.start_pos + len(c.token_ids)
        ids = [self.kv[c.page_table[p // self.page_size]][p % self.page_size] for p in range(n)]
        assert None not in ids, "read an unwritten KV slot"
        return ids  # type: ignore[return-value]

    def _sample(self, c: SeqChunk) -> int:
        ids = self._read(c)
        for prompt, outputs in self.scripts.items():
            k = len(ids) - len(prompt)
            if tuple(ids[: len(prompt)]) == prompt and 0 <= k < len(outputs):
                return outputs[k]
        h = 0
        for t in ids:
            h = (h * 1000003 + t + 1) % (1 << 61)
        if c.params.temperature > 0 and c.params.top_k != 1:
            noise = torch.randint(0, 1 << 30, (1,), generator=c.generator).item()
            h ^= int(noise)
        return 97 + h % 26  # a lowercase letter
