#!/usr/bin/env bash
# State parity (docs/membership.md, "State parity") with real geotrain-worker
# processes: `geotrain local --preset world` (on the namespace network as
# root, kernel TCP between the regions; over loopback otherwise), mlp on
# Fashion-MNIST, DTS with its defaults (K and D auto, qsgd-4).
#   flip      bit 28 of parameter 1000 of oregon's model (rank 2) flipped at
#             the first round boundary after step 300 (GEO_TEST_FLIP_BIT; a
#             weight of ~0.02 becomes ~4e-12): oregon names itself as the
#             one that differs within 5 rounds of the flip, repairs itself
#             from a peer (exactly that value changes, by the flipped
#             amount), without a restart; the others name oregon; no worker
#             finds a difference in any check after the repair; every
#             worker ends with the same model, and the job's accuracy is
#             within 1 point of the run without the flip.
#   clean     the same job without the flip: no check finds a difference
#             (no false alarm from rounding or late contributions).
# Usage: parity_e2e_test.sh GEOTRAIN
set -uo pipefail
geotrain="$1"
source "$(dirname "$0")/test_prologue.sh"
fail_lines=15
fail_detail() {
  for run in clean flip; do
    echo "--- $run: what the workers logged of state parity, late updates and faults"
    grep -H "state parity\|GEO_TEST_FLIP_BIT\|late\|suspected\|heard again" \
      "$work/$run"/logs/worker-*.log 2>/dev/null | sed "s|$work/||" | head -60
  done
}
network=userspace
[[ "$(id -u)" -eq 0 ]] && network=netns
common=(--network "$network" --preset world --model mlp --eval-interval 0 --threads 1
        --steps 800 --step-time 10ms --set training.logInterval=100)

echo "network: $network"
run clean GEO_TEST_FLIP_BIT=
run flip GEO_TEST_FLIP_BIT=2:300:1000:28

python3 - "$work" "$(dirname "$0")/../../support" <<'PY' || fail "figures out of bounds"
import json, os, re, sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from checks import check, finish  # noqa: E402
def logs(name):
    d = os.path.join(work, name, "logs")
    return {r: open(os.path.join(d, f"worker-{r}.log")).read() for r in range(4)}
summary = {n: json.load(open(os.path.join(work, n, "summary.json"))) for n in ("clean", "flip")}
for n in ("clean", "flip"):
    rc = open(os.path.join(work, f"{n}.rc")).read().strip()
    check(rc == "0", f"{n}: geotrain local exited {rc}")
    check(summary[n]["modelsAgree"] is True, f"{n}: the final models differ")
    check(not summary[n]["faults"] or all(not f.get("restarts") for f in summary[n]["faults"]),
          f"{n}: faults {summary[n]['faults']}")

clean = logs("clean")
for r, text in clean.items():
    # Every parity message starts "dts: state parity:" (the stage times at
    # the end name "state parity" without the colon).
    check("state parity:" not in text,
          f"clean: rank {r} found a difference: {re.findall(r'.*state parity:.*', text)[:3]}")

flip = logs("flip")
m = re.search(r"GEO_TEST_FLIP_BIT: flipped bit 28 of parameter 1000 at step (\d+) "
              r"\(the start of round (\d+)\): (\S+) -> (\S+)", flip[2])
if check(m, "flip: rank 2 did not flip the bit"):
    step, round_, before, after = int(m[1]), int(m[2]), float(m[3]), float(m[4])
    found = re.search(r"this worker's job model differs from the job's at round (\d+) "
                      r"\((\d+) of (\d+) workers compared hold another\); repairing it from "
                      r"(rank \d \(\w+\))", flip[2])
    if check(found, "flip: rank 2 never found its model differs"):
        check(int(found[1]) <= round_ + 5,
              f"flip: found at round {found[1]}, the flip was at round {round_}")
        repaired = re.search(r"repaired this worker's job model from (rank \d \(\w+\))'s as of "
                             r"round (\d+): (\d+) value\(s\) differed beyond rounding, by up to "
                             r"(\S+); training goes on", flip[2])
        if check(repaired, "flip: rank 2 did not repair its model"):
            check(repaired[1] == found[4], f"flip: repaired from {repaired[1]}, asked {found[4]}")
            check(repaired[3] == "1", f"flip: {repaired[3]} values repaired, expected 1")
            moved = float(repaired[4])
            check(abs(moved - abs(before - after)) <= 0.01 * abs(before - after),
                  f"flip: repaired by {moved}, the flip moved the value by {abs(before - after)}")
            after_round = int(repaired[2])
            for r, text in flip.items():
                late = [int(x) for x in re.findall(r"state parity: at round (\d+) ", text)
                        if int(x) > after_round]
                check(not late, f"flip: rank {r} still found differences at rounds {late} "
                                f"after the repair as of round {after_round}")
            print(f"flip at step {step} (round {round_}); found at round {found[1]} "
                  f"({found[2]} of {found[3]} hold another); repaired as of round "
                  f"{repaired[2]} from {repaired[1]}: {repaired[3]} value, by {moved}")
    for r in (0, 1, 3):
        check(re.search(r"state parity: at round \d+ the job model of rank 2 \(oregon\) differs",
                        flip[r]), f"flip: rank {r} never named rank 2")
        check("repaired" not in flip[r], f"flip: rank {r} repaired its model")
accuracy = {n: summary[n]["testAccuracy"] for n in summary}
check(abs(accuracy["flip"] - accuracy["clean"]) <= 0.01,
      f"accuracy {accuracy['flip']:.4f} with the flip, {accuracy['clean']:.4f} without")
print(f"accuracy: {accuracy['flip']:.4f} with the flip, {accuracy['clean']:.4f} without")
finish()
PY
echo "parity: all checks passed"
