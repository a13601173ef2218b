#!/usr/bin/env bash
# geotrain-worker end to end: help, config errors, data errors, a short run,
# checkpoint + resume. Usage: geotrain_worker_cli_test.sh PATH/TO/geotrain-worker
set -u
worker=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NAME EXPECTED_EXIT PATTERN -- command...
  local name=$1 expect=$2 pattern=$3
  shift 4
  local out code
  out=$("$@" 2>&1)
  code=$?
  if [[ $code -ne $expect ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name: exit $code (want $expect), output:"
    echo "$out" | tail -5
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

check help 0 'worker.yaml' -- "$worker" --help
check unknown-flag 2 'unknown|extra|not expected|The following argument' -- "$worker" --no-such-flag
printf 'training:\n  lrr: 0.1\n' >"$tmp/typo.yaml"
check unknown-key 2 "training.lrr.*did you mean 'lr'" -- "$worker" --config "$tmp/typo.yaml"
check bad-value 2 "sync.bits.*3.*2, 4, 8" -- "$worker" --set sync.bits=3
check bad-set 2 "key=value" -- "$worker" --set training.lr
check missing-data 1 "/nonexistent" -- "$worker" --data-path /nonexistent --steps 1
check print-config 0 "batchSize: 64" -- "$worker" --print-config
check synthetic-run 0 "step +20 loss" -- "$worker" --dataset synthetic --set dataset.path= \
  --steps 20 --set training.logInterval=10 --set training.evalInterval=0
check checkpoint 0 "step +10" -- "$worker" --dataset synthetic --set dataset.path= --steps 10 \
  --checkpoint-dir "$tmp/ckpt" --set checkpoint.interval=5 --set training.logInterval=5
check resume 0 "resumed at step 10" -- "$worker" --dataset synthetic --set dataset.path= \
  --steps 15 --checkpoint-dir "$tmp/ckpt" --set checkpoint.interval=5 --set training.logInterval=5

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all geotrain-worker checks passed"
