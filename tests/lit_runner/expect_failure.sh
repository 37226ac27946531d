#!/usr/bin/env bash
# Proves that lit, with kiln's tests/lit.cfg.py, fails a text test for the right reason: runs
# LIT (build/bin/kiln-lit, with its interpreter) on FIXTURE and passes only when lit exits 1
# (or the status a `# EXPECT-STATUS: N` line gives), its output contains the text of every
# `# EXPECT-FAILURE: text` line of FIXTURE, and none of the `# EXPECT-NOT: text` lines.
#
#   usage: expect_failure.sh FIXTURE LIT...
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: expect_failure.sh FIXTURE LIT..." >&2; exit 2; }
fixture=$1
shift
mapfile -t expected < <(sed -n 's/^# EXPECT-FAILURE: //p' "$fixture")
mapfile -t unexpected < <(sed -n 's/^# EXPECT-NOT: //p' "$fixture")
want_status=$(sed -n 's/^# EXPECT-STATUS: //p' "$fixture")
want_status=${want_status:-1}
if [ ${#expected[@]} -eq 0 ]; then
  echo "expect_failure.sh: $fixture has no EXPECT-FAILURE line" >&2
  exit 2
fi

output=$("$@" -v "$fixture" 2>&1)
status=$?
ok=1
if [ "$status" -ne "$want_status" ]; then
  echo "expect_failure.sh: lit exited with status $status, expected $want_status"
  ok=0
fi
for text in "${expected[@]}"; do
  if ! grep -qF -- "$text" <<<"$output"; then
    echo "expect_failure.sh: lit's output lacks: $text"
    ok=0
  fi
done
for text in "${unexpected[@]}"; do
  if grep -qF -- "$text" <<<"$output"; then
    echo "expect_failure.sh: lit's output has: $text"
    ok=0
  fi
done
if [ $ok -eq 0 ]; then
  echo "--- lit's output ---"
  printf '%s\n' "$output"
  exit 1
fi
echo "lit failed as expected (status $status): ${expected[*]}"
