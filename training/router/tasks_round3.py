"""Round 3 of the router's checkable tasks: families unlike round 1 and 2's templates.

Letter counting, word reversal, weekday arithmetic, list picks, ordering puzzles and
alphabetical order. Each family draws easy and hard items of about the same length (a
short word next to a long one, "in 2 days" next to "in 47 days"), so the labels measure
difficulty and not only length. training/router/tasks.py draws them after round 2 from the
same rng, so every earlier id keeps its prompt.
"""

import itertools
import random
import string

from training.router.task import Task

_WORDS = [
    "cat", "dog", "sun", "map", "tree", "book", "lamp", "rain", "apple", "river",
    "house", "plant", "garden", "window", "pepper", "yellow", "banana", "balloon",
    "letter", "mississippi", "strawberry", "committee", "bookkeeper", "engineering",
    "parallel", "assessment", "possession", "necessary", "occurrence", "millennium",
    "raspberry", "tomorrow", "successful", "accommodate", "embarrass", "referee",
]  # fmt: skip
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_PEOPLE = ["Ana", "Ben", "Li", "Sara", "Omar", "Maya", "Tom", "Ivy"]


def letter_count(rng: random.Random, i: int) -> Task:
    word = rng.choice(_WORDS)
    letter = rng.choice(sorted(set(word)))
    prompt = rng.choice(
        [
            "How many times does the letter '{l}' appear in the word '{w}'?",
            "Count the letter '{l}' in '{w}'. How many are there?",
        ]
    ).format(l=letter, w=word)
    return Task(f"letters-{i}", "letter_count", prompt, str(word.count(letter)), "number")


def reverse_word(rng: random.Random, i: int) -> Task:
    word = rng.choice(_WORDS)
    prompt = rng.choice(
        ["Write the word '{}' backwards.", "Reverse the letters of the word '{}'."]
    ).format(word)
    return Task(f"reverse-{i}", "reverse_word", prompt, word[::-1], "text")


def weekday(rng: random.Random, i: int) -> Task:
    today = rng.randrange(7)
    days = rng.choice([1, 2, 3, rng.randint(8, 30), rng.randint(31, 100)])
    later = rng.random() < 0.7
    expected = WEEKDAYS[(today + days if later else today - days) % 7]
    span = f"{days} day{'s' if days > 1 else ''}"
    when = f"in {span}" if later else f"{span} ago"
    verb = "will it be" if later else "was it"
    prompt = f"If today is {WEEKDAYS[today]}, what day of the week {verb} {when}?"
    return Task(f"weekday-{i}", "weekday", prompt, expected, "choice", options=WEEKDAYS)


def list_pick(rng: random.Random, i: int) -> Task:
    xs = rng.sample(range(1, 100), rng.choice([3, 4, 5, 6, 7]))
    ask, value = rng.choice(
        [
            ("the largest number", max(xs)),
            ("the smallest number", min(xs)),
            ("the second largest number", sorted(xs)[-2]),
            ("the sum of the numbers", sum(xs)),
            ("how many numbers are even", sum(x % 2 == 0 for x in xs)),
        ]
    )
    prompt = f"In the list {', '.join(map(str, xs))}, what is {ask}?"
    return Task(f"list-{i}", "list_pick", prompt, str(value), "number")


def ordering(rng: random.Random, i: int) -> Task:
    """A chain of 'X is taller than Y' facts, shown shuffled; ask for one end of it."""
    people = rng.sample(_PEOPLE, rng.choice([2, 3, 3, 4, 5]))
    facts = [f"{a} is taller than {b}." for a, b in itertools.pairwise(people)]
    rng.shuffle(facts)
    tallest = rng.random() < 0.5
    expected = people[0] if tallest else people[-1]
    prompt = f"{' '.join(facts)} Who is the {'tallest' if tallest else 'shortest'}?"
    return Task(f"order-{i}", "ordering", prompt, expected, "choice", options=tuple(people))


def alphabetical(rng: random.Random, i: int) -> Task:
    """Easy items differ in the first letter; hard ones share a prefix of up to three."""
    prefix = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.choice([0, 0, 2, 3])))
    count, words = rng.choice([3, 4, 5]), set()
    while len(words) < count:
        words.add(prefix + "".join(rng.choice("aeioubdklmnprst") for _ in range(4)))
    shown = rng.sample(sorted(words), len(words))
    first = rng.random() < 0.5
    expected = min(words) if first else max(words)
    prompt = (
        f"Which of these words comes {'first' if first else 'last'} in alphabetical order: "
        f"{', '.join(shown)}?"
    )
    return Task(f"alpha-{i}", "alphabetical", prompt, expected, "choice", options=tuple(shown))


ROUND3_GENERATORS = {
    "letter_count": letter_count,
    "reverse_word": reverse_word,
    "weekday": weekday,
    "list_pick": list_pick,
    "ordering": ordering,
    "alphabetical": alphabetical,
}
# Drawn in this repeating pattern, so any prefix of round 3 is a mix of its families.
ROUND3_PATTERN = tuple(ROUND3_GENERATORS)
ROUND3_REPEATS = 300
# Still drawn (so the rng, and every later task, stays as it was) but not kept: on its first
# 31 tasks neither tier reversed one word right (both rates 0), so it labels nothing.
ROUND3_DROPPED = frozenset({"reverse_word"})
