"""What every Python test of this project shares: check() records a failed
expectation and goes on, so that one run names every failure, not the first;
finish() ends the test with their count. The modules of one test (a test and
its support module) share one list of failures.

    sys.path.insert(0, os.path.join(REPO, "tests", "support"))
    from checks import check, failures, finish
"""

import sys

# Every failed check of this process, in order.
failures = []
# True: a line for every check that passes too (for tests whose passes are
# the evidence worth reading in ctest's log).
verbose = False


def check(ok, what):
    """Records `what` as failed unless `ok`; returns `ok` (for `if check(...)`)."""
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)
    elif verbose:
        print("ok   ", what, flush=True)
    return ok


def finish(detail=""):
    """Exits 1 when a check failed (printing the count and `detail`), else
    prints that every check passed and returns."""
    if failures:
        print(f"{len(failures)} check(s) failed{'; ' + detail if detail else ''}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)
