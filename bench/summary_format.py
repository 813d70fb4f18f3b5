"""The cells of docs/benchmarks.md's rows, shared by bench/summary.py and its row modules."""

# figure, value, same-run baseline, ratio (value / baseline, or "" where none applies)
Row = tuple[str, str, str, str]


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x" if baseline else ""
