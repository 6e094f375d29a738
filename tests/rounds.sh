#!/usr/bin/env bash
# `make rounds`: ROUNDS rounds (default 20) of the tests that start several processes or depend on timing, in two
# streams side by side as `make test` runs its two lanes (one thread each, the lanes' XLA flags), so that each round
# runs them under CI's load. A round's two streams start together. Each part's JUnit report and log go to OUT
# (default .rounds/), one line per part and per round to OUT/summary.txt; the run ends with the count of parts
# that passed. Needs PY (the venv's python) and XLA (the lanes' XLA flags), which the Makefile passes.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-.rounds}
mkdir -p "$OUT" && rm -f "$OUT"/summary.txt "$OUT"/r*-*.xml "$OUT"/r*-*.log  # only what a run writes
OTHERS="not backend_independent and not one_backend"  # what make test runs on tensorflow and jax
SEVERAL=(tests/test_finetune_multiprocess.py tests/test_multiprocess.py tests/test_launchers.py
         tests/test_finetune_shards.py::test_two_processes_train_on_shards_to_the_one_process_model)
TIMING=(tests/test_writer_kill.py tests/test_cli_subprocess.py::test_ctrl_c_in_finetune_says_one_line_and_exits_130
        tests/test_examples.py::test_killed_run_resumes_to_the_same_weights)

part() {  # round name backend marker tests...
  local round=$1 name=$2 backend=$3 marker=$4 start=$SECONDS
  shift 4
  XLA_FLAGS="$XLA" OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 KERAS_BACKEND=$backend \
    "$PY" -m pytest -q -p no:cacheprovider -rfE -m "$marker" --junitxml="$OUT/r$round-$name.xml" "$@" \
    > "$OUT/r$round-$name.log" 2>&1
  echo "round $round $name: exit $? in $((SECONDS - start)) s: $(tail -n 1 "$OUT/r$round-$name.log")" >> "$OUT/summary.txt"
}

for round in $(seq 1 "${ROUNDS:-20}"); do
  start=$SECONDS
  ( part "$round" tensorflow tensorflow "$OTHERS" "${SEVERAL[@]}"
    part "$round" torch-timing torch "" "${TIMING[@]}" ) &
  ( part "$round" jax jax "$OTHERS" "${SEVERAL[@]}"
    part "$round" torch torch "" tests/test_multiprocess.py tests/test_launchers.py tests/test_finetune_multiprocess.py ) &
  wait
  echo "round $round took $((SECONDS - start)) s; load $(cut -d ' ' -f 1-3 /proc/loadavg)" >> "$OUT/summary.txt"
done
echo "$(grep -c ': exit 0 ' "$OUT/summary.txt") of $(grep -c ': exit ' "$OUT/summary.txt") parts passed ($OUT/summary.txt)"
