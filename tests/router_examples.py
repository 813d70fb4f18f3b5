"""A small labelled examples set for router tests: one-fact prompts against long proof and
design prompts, 64 in all (a scorer trains on it in a second)."""

EASY = ["What is {} + {}?", "Say hi to {} and {}.", "Name the color of {} {}."]
HARD = [
    "Prove that the sum of the first {} odd numbers is a square, then generalise it to {} "
    "dimensions, explain every step and give a formal induction argument.",
    "Design a distributed consensus protocol for {} nodes tolerating {} faults; compare it "
    "with Raft and Paxos, analyse its message complexity and prove its safety.",
]


def examples() -> list[dict]:
    rows = [{"prompt": t.format(a, a + 1), "label": 0} for t in EASY for a in range(1, 9)]
    rows += [{"prompt": t.format(a, a + 2), "label": 1} for t in HARD for a in range(3, 15)]
    return rows
