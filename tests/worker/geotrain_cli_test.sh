#!/usr/bin/env bash
# End-to-end test of the `geotrain` command line: keygen writes both key files
# with the right modes and contents, refuses to overwrite them, and the help,
# version and missing-command paths behave. Usage: geotrain_cli_test.sh GEOTRAIN
set -euo pipefail

geotrain=$(realpath "${1:?usage: $0 PATH_TO_GEOTRAIN}")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/geotrain-cli-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# expect_contains NAME TEXT NEEDLE
expect_contains() {
  grep -qF -- "$3" <<<"$2" || fail "$1 does not contain '$3'; it was:"$'\n'"$2"
}

# --- keygen writes a fresh pair ------------------------------------------------
out="$tmp/keys/london"
stdout=$("$geotrain" keygen --out "$out" --name london-0) || fail "keygen exited with $?"
[[ -f "$out/london-0.key" ]] || fail "no $out/london-0.key"
[[ -f "$out/london-0.pub" ]] || fail "no $out/london-0.pub"
[[ $(stat -c %a "$out/london-0.key") == 600 ]] || fail "secret key mode $(stat -c %a "$out/london-0.key")"
[[ $(stat -c %a "$out/london-0.pub") == 644 ]] || fail "public key mode $(stat -c %a "$out/london-0.pub")"
[[ $(stat -c %a "$out") == 700 ]] || fail "key directory mode $(stat -c %a "$out")"
expect_contains "keygen output" "$stdout" "$out/london-0.key"
expect_contains "keygen output" "$stdout" "$out/london-0.pub"

pub=$(cat "$out/london-0.pub")
sec=$(cat "$out/london-0.key")
[[ ${#pub} -eq 40 && ${#sec} -eq 40 ]] || fail "keys are not 40 characters: '${pub}'"
[[ $(wc -c <"$out/london-0.pub") -eq 41 ]] || fail "public key file is not 40 characters + newline"
[[ $pub != "$sec" ]] || fail "public and secret key are equal"
expect_contains "keygen output" "$stdout" "public key: $pub"

# --- a second run refuses and leaves the files alone --------------------------
set +e
stderr=$("$geotrain" keygen --out "$out" --name london-0 2>&1 >/dev/null)
code=$?
set -e
[[ $code -ne 0 ]] || fail "second keygen into the same files succeeded"
expect_contains "second keygen's error" "$stderr" "already exists"
expect_contains "second keygen's error" "$stderr" "$out/london-0.key"
[[ $(cat "$out/london-0.pub") == "$pub" ]] || fail "the public key was overwritten"
[[ $(cat "$out/london-0.key") == "$sec" ]] || fail "the secret key was overwritten"

# --- defaults: ./worker.{key,pub} -----------------------------------------------
(cd "$tmp" && "$geotrain" keygen >/dev/null) || fail "keygen with defaults failed"
[[ -f "$tmp/worker.key" && -f "$tmp/worker.pub" ]] || fail "defaults did not write ./worker.key and ./worker.pub"

# --- an output path that is a file is a clear error ---------------------------
touch "$tmp/plain-file"
set +e
stderr=$("$geotrain" keygen --out "$tmp/plain-file" 2>&1 >/dev/null)
code=$?
set -e
[[ $code -eq 1 ]] || fail "keygen into a file exited with $code, expected 1"
expect_contains "keygen-into-a-file error" "$stderr" "$tmp/plain-file"

# --- help, version, usage errors -----------------------------------------------
help=$("$geotrain" --help) || fail "geotrain --help exited with $?"
expect_contains "geotrain --help" "$help" "keygen"
expect_contains "geotrain --help" "$help" "--version"
help=$("$geotrain" keygen --help) || fail "geotrain keygen --help exited with $?"
expect_contains "geotrain keygen --help" "$help" "--out"
expect_contains "geotrain keygen --help" "$help" "--name"
expect_contains "geotrain keygen --help" "$help" "0600"

version=$("$geotrain" --version) || fail "geotrain --version exited with $?"
[[ $version =~ ^geotrain\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "unexpected version line '$version'"

set +e
stderr=$("$geotrain" 2>&1 >/dev/null)
code=$?
set -e
[[ $code -eq 1 ]] || fail "geotrain without a command exited with $code, expected 1"
expect_contains "geotrain without a command" "$stderr" "keygen"

set +e
"$geotrain" keygen --no-such-flag >/dev/null 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || fail "an unknown flag exited with $code, expected 2"

echo "geotrain CLI: all checks passed"
