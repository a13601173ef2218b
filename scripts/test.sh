#!/usr/bin/env bash
# Quick start, step 2: install what is missing, build, and run the whole test
# suite with ctest. Extra arguments go to ctest (e.g. -R Qsgd, -L kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DGEO_BUILD_TESTS=ON
cd "${GEO_BUILD_DIR:-build}"
rc=0
ctest --output-on-failure -j "${GEO_JOBS:-$(nproc)}" "$@" || rc=$?
if ((rc != 0)) && [[ -f Testing/Temporary/LastTestsFailed.log ]]; then
  # The failures again, at the end, where a log cut to its tail still shows
  # them: each failed test's last lines (ctest printed them whole, in the
  # middle of thousands of others).
  python3 - Testing/Temporary/LastTestsFailed.log Testing/Temporary/LastTest.log <<'PY' || true
import re, sys
failed = [l.split(":", 1)[1].strip() for l in open(sys.argv[1]) if ":" in l]
log = open(sys.argv[2], errors="replace").read()
for name in failed:
    m = re.search(r"^\d+/\d+ Test: " + re.escape(name) + r"\n.*?^Output:\n-+\n(.*?)^<end of output>",
                  log, re.S | re.M)
    lines = m.group(1).splitlines() if m else ["(no output recorded)"]
    # Where it says it failed (a script's FAIL, GoogleTest's Failure), with
    # what led there; then its last lines.
    marks = [i for i, l in enumerate(lines) if l.startswith("FAIL") or "Failure" in l][:3]
    for i in marks:
        print(f"=== failed: {name}: lines {max(i - 15, 0) + 1}-{i + 4} of {len(lines)}")
        print("\n".join(l[:400] for l in lines[max(i - 15, 0):i + 4]))
    print(f"=== failed: {name}: its last {min(len(lines), 40)} lines of {len(lines)}")
    print("\n".join(l[:400] for l in lines[-40:]))
PY
fi
exit "$rc"
