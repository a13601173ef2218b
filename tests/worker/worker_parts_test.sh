#!/usr/bin/env bash
# geotrain-worker's two parts (worker/app/training_library.h): the executable
# and its base library carry no LibTorch, the training library does; no
# symbol is defined in both libraries (one copy of the transport, the
# configuration, the logger); the executable finds the training library next
# to itself or in ../lib/geotrain/, and says where it looked when it is
# missing; a worker opens its connections before it loads the training
# library. Usage: worker_parts_test.sh GEOTRAIN-WORKER GEOTRAIN
set -u
worker=$1
geotrain=$2
dir=$(dirname "$worker")
base=$dir/libgeotrain-worker-base.so
training=$dir/libgeotrain-worker-training.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}
ok() { echo "ok   $*"; }

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
for f in "$worker" "$base"; do
  if needed "$f" | grep -qE '^lib(torch|c10)'; then
    fail "$(basename "$f") needs LibTorch: $(needed "$f" | grep -E '^lib(torch|c10)' | tr '\n' ' ')"
  else
    ok "$(basename "$f") needs no LibTorch"
  fi
done
if needed "$training" | grep -qE '^lib(torch|c10)'; then
  ok "the training library needs LibTorch"
else
  fail "the training library does not need LibTorch: is it the right file?"
fi

strong() { nm -D --defined-only "$1" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort -u; }
both=$(comm -12 <(strong "$base") <(strong "$training"))
if [[ -n $both ]]; then
  fail "defined in both libraries (two copies of their state): $(head -5 <<<"$both" | c++filt | tr '\n' ';')"
else
  ok "no symbol defined in both libraries ($(strong "$training" | wc -l) in the training library)"
fi

run=(--dataset synthetic --set dataset.path= --steps 5 --set training.logInterval=5
     --set training.evalInterval=0)
mkdir -p "$tmp/alone"
cp "$worker" "$base" "$tmp/alone/"
out=$("$tmp/alone/geotrain-worker" --help 2>&1)
if [[ $? -eq 0 ]]; then ok "--help without the training library"; else fail "--help: $out"; fi
out=$("$tmp/alone/geotrain-worker" "${run[@]}" 2>&1)
code=$?
if [[ $code -eq 1 ]] && grep -q "libgeotrain-worker-training.so" <<<"$out" &&
   grep -q "$tmp/alone/libgeotrain-worker-training.so: no such file" <<<"$out" &&
   grep -q "$tmp/lib/geotrain/libgeotrain-worker-training.so: no such file" <<<"$out"; then
  ok "a missing training library is named, with where it was looked for"
else
  fail "missing training library: exit $code, output: $(tail -3 <<<"$out")"
fi

mkdir -p "$tmp/bin" "$tmp/lib/geotrain"
cp "$worker" "$tmp/bin/"
cp "$base" "$training" "$tmp/lib/geotrain/"
out=$("$tmp/bin/geotrain-worker" "${run[@]}" 2>&1)
code=$?
if [[ $code -eq 0 ]] && grep -q "loaded $tmp/lib/geotrain/libgeotrain-worker-training.so" <<<"$out"; then
  ok "bin/ and lib/geotrain/"
else
  fail "bin/ and lib/geotrain/: exit $code, output: $(tail -3 <<<"$out")"
fi

# Two workers: each opens its connections, then loads the training library.
if "$geotrain" local --regions a,b --preset lan --steps 5 --eval-interval 0 --threads 1 -o "$tmp/two" \
    >"$tmp/two.txt" 2>&1; then
  log=$tmp/two/logs/worker-1.log
  connect=$(grep -n -m1 'transport: rank 1 of 2 connecting to 1 peer$' "$log" | cut -d: -f1)
  loaded=$(grep -n -m1 'loaded .*libgeotrain-worker-training.so in' "$log" | cut -d: -f1)
  blas=$(grep -n -m1 'I BLAS: ' "$log" | cut -d: -f1)
  if [[ -n $connect && -n $loaded && -n $blas ]] && ((connect < loaded && loaded < blas)); then
    ok "connections first (log line $connect), the training library loaded (line $loaded), then training (line $blas)"
  else
    fail "order of connect/load/BLAS lines: ${connect:-none} ${loaded:-none} ${blas:-none}"
    head -5 "$log"
  fi
else
  fail "two workers: $(tail -5 "$tmp/two.txt")"
fi

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
