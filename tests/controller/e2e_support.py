"""What the controller's end-to-end tests share: checks that record failures
instead of stopping at the first, loopback ports that no outgoing connection
can take (outside the kernel's ephemeral range, see tests/worker/free_ports.py),
and polling with a time-out."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../worker"))
from free_ports import free_ports  # noqa: E402

# Every failed check, in order; a test exits non-zero when this is not empty.
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return ok


def free_port():
    return free_ports(1)[0]


def wait_for(what, predicate, timeout=30):
    """predicate()'s first truthy value, polled every 0.25 s; None (and a
    failed check) after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    check(False, f"timed out after {timeout} s waiting for {what}")
    return None
