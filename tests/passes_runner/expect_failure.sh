#!/usr/bin/env bash
# Proves that tests/passes/check.sh fails for the right reason: runs it on FIXTURE and
# passes only when it exits 1 (or the status a `# EXPECT-STATUS: N` line gives) and its
# output contains the text of every `# EXPECT-FAILURE: text` line of FIXTURE.
#
#   usage: expect_failure.sh CHECK_SH KILN FIXTURE
set -uo pipefail
[ $# -eq 3 ] || { echo "usage: expect_failure.sh CHECK_SH KILN FIXTURE" >&2; exit 2; }
check=$1 kiln=$2 fixture=$3
mapfile -t expected < <(sed -n 's/^# EXPECT-FAILURE: //p' "$fixture")
want_status=$(sed -n 's/^# EXPECT-STATUS: //p' "$fixture")
want_status=${want_status:-1}
if [ ${#expected[@]} -eq 0 ]; then
  echo "expect_failure.sh: $fixture has no EXPECT-FAILURE line" >&2
  exit 2
fi

output=$(bash "$check" "$kiln" "$fixture" 2>&1)
status=$?
ok=1
if [ "$status" -ne "$want_status" ]; then
  echo "expect_failure.sh: check.sh exited with status $status, expected $want_status"
  ok=0
fi
for text in "${expected[@]}"; do
  if ! grep -qF -- "$text" <<<"$output"; then
    echo "expect_failure.sh: check.sh's output lacks: $text"
    ok=0
  fi
done
if [ $ok -eq 0 ]; then
  echo "--- check.sh's output ---"
  printf '%s\n' "$output"
  exit 1
fi
echo "check.sh failed as expected (status $status): ${expected[*]}"
