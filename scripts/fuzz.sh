#!/usr/bin/env bash
# Runs every libFuzzer target of build/fuzz for FUZZ_SECONDS each (default 60), starting from
# the checked-in seeds in tests/fuzz/corpus/<target>/. New inputs go to build/fuzz/corpus/, not
# into the tree; a crash, a leak or a timeout leaves its input in build/fuzz/artifacts/ and fails
# the run (turn it into a regression seed: copy it into tests/fuzz/corpus/<target>/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
bin=build/fuzz/tests/fuzz
work=build/fuzz/corpus
artifacts=build/fuzz/artifacts
mkdir -p "$work" "$artifacts"
status=0
for target in $(ls "$bin" | grep '_fuzz$' | sort); do
  mkdir -p "$work/$target" "tests/fuzz/corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  if ! "$bin/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/$target-" \
       "$work/$target" "tests/fuzz/corpus/$target" > "build/fuzz/$target.log" 2>&1; then
    echo "fuzz: $target FAILED; its log (tail):"
    tail -n 40 "build/fuzz/$target.log"
    status=1
  else
    grep -E 'stat::number_of_executed_units|stat::new_units_added' "build/fuzz/$target.log" |
      tr '\n' ' '
    echo
  fi
done
exit $status
