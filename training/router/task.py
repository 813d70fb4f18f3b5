"""One checkable task of the router's label set: a prompt, its expected answer and how the
answer is checked (training/router/tasks.py and tasks_round3.py draw them)."""

from dataclasses import dataclass

SHORT_SYSTEM = "Answer the question. Reply with only the final answer."


@dataclass(frozen=True)
class Task:
    id: str
    family: str
    prompt: str  # the user message the router sees
    expected: str
    kind: str  # "number" | "text"
    system: str = SHORT_SYSTEM
    max_tokens: int = 48
    options: tuple[str, ...] = ()  # kind "choice": the names the answer picks among
