"""The prompt signals' names, in the order of the difficulty classifier's features.

The one list: the policy's `difficulty.blend` weights and `min_signals`/`max_signals` keys
are checked against it, and routing's `Signals` (gateway/routing/signals.py) has one field
per name, so a signal added here is a knob, a field and a feature at once.
"""

SIGNAL_NAMES = (
    "tokens",
    "code",
    "math",
    "multi_step",
    "constraints",
    "tools",
    "depth",
    "max_tokens",
)
