"""The pairwise judge of `tiergate router learn`: is the small tier's answer as good as the
large tier's? Its verdict is the sample's label: needs-large = 1 when it is not.

The prompt asks for one word; the reply is read robustly (the first YES or NO word, or a
phrase such as "as good" / "worse", case and punctuation aside). A reply that says neither
leaves the sample unlabelled (counted in the report), never guessed.
"""

import re

MAX_CHARS = 2000  # of the request and of each answer shown to the judge
JUDGE_MAX_TOKENS = 8

PROMPT = """You compare two answers to the same request.

Request:
<<<
{request}
>>>

Answer A:
<<<
{small}
>>>

Answer B:
<<<
{large}
>>>

Is answer A as good as answer B: as correct, as complete and as helpful? Reply with one \
word, YES or NO."""

_NO = re.compile(r"\b(no|not as good|worse|inferior|b is better)\b")
_YES = re.compile(r"\b(yes|as good|equally good|same quality|a is better)\b")


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + " [...]"


def render_request(messages: list[dict]) -> str:
    """One user turn as itself; a conversation as `role: content` lines."""
    if len(messages) == 1:
        return str(messages[0].get("content") or "")
    return "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages)


def judge_messages(messages: list[dict], small: str, large: str) -> list[dict]:
    text = PROMPT.format(
        request=_clip(render_request(messages)), small=_clip(small), large=_clip(large)
    )
    return [{"role": "user", "content": text}]


def parse_verdict(reply: str) -> int | None:
    """1: A (small) is not as good (needs large); 0: it is; None: the reply says neither.
    The earliest of the two readings wins ("No, B is better" and "Yes." alike)."""
    text = reply.strip().lower()
    no, yes = _NO.search(text), _YES.search(text)
    if no is None and yes is None:
        return None
    if yes is None or (no is not None and no.start() <= yes.start()):
        return 1
    return 0
