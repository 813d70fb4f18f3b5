"""Labels from a reference answer, for traffic whose right answer is known: a sample that
carries `reference` (the expected final number, or a short text) is labelled by checking
both tiers' answers against it, not by the judge. Needs-large = 1 when the small tier's
answer is wrong and the large tier's right; both wrong or the small one right is 0 (sending
it up buys nothing). A deployer adds `reference` to the exported samples it can check (an
eval set replayed through the route, tickets with a known resolution); the rest go to the
judge.

The check is the one the prior's outcome tasks used (training/router/tasks.py): a number
reference matches the last number the answer writes, a text reference must appear in it.
"""

import re

from training.router.tasks import is_correct

REFERENCE_JUDGE = "reference"  # the verdict's `judge` for these labels
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def reference_kind(reference: str) -> str:
    """ "number" when the reference is one number (commas and spaces aside), else "text"."""
    return "number" if _NUMBER.fullmatch(reference.replace(",", "").strip()) else "text"


def reference_verdict(reference: str, small: str, large: str) -> dict:
    kind = reference_kind(reference)
    expected = reference.replace(",", "").strip() if kind == "number" else reference
    small_ok = is_correct(kind, expected, small)
    large_ok = is_correct(kind, expected, large)
    return {
        "judge": REFERENCE_JUDGE,
        "small_correct": small_ok,
        "large_correct": large_ok,
        "needs_large": int(large_ok and not small_ok),
    }
