"""Fuzz the live gateway with schemathesis (`make bench`): >= 1,000 generated cases.

Same driver as tests/test_fuzz.py (a few hundred cases there), more examples here: valid
and invalid bodies for every OpenAI operation, half routed to the real small engine.
Figures: cases sent, statuses seen, findings (5xx, non-OpenAI error bodies, dropped
connections); goal: zero findings and the service answering afterwards.

    python -m bench.fuzz [--quick] [--examples N]
"""

import argparse
import tempfile
import time

from bench import common
from gateway.app import create_app
from tests.fuzz_gateway import fuzz, fuzz_policy
from tests.servers import run_uvicorn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="150 examples per operation")
    p.add_argument("--examples", type=int, help="examples per operation (default 400)")
    args = p.parse_args()
    examples = args.examples or (150 if args.quick else 400)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        app = create_app(fuzz_policy(f"{tmp}/cache.sqlite3"))
        with run_uvicorn(app) as url:
            report = fuzz(url, examples)
    seconds = time.perf_counter() - started
    result = {
        "examples_per_operation": examples,
        "cases_sent": report.cases,
        "cases_unsendable": report.unsendable,
        "statuses": {str(k): v for k, v in sorted(report.statuses.items())},
        "findings": report.failures,
        "seconds": round(seconds, 1),
        "goals": {"no_findings": common.goal(len(report.failures), 0, False)},
    }
    print(f"fuzz: {report.cases} cases in {seconds:.0f} s, statuses {result['statuses']}")
    for finding in report.failures[:20]:
        print(f"  finding: {finding}")
    common.write_result("fuzz", result)


if __name__ == "__main__":
    main()
