#!/usr/bin/env bash
# Time and peak RSS of every command on a dump of many one-row steps (benchmarks/make_many_steps.py).
#   benchmarks/bench_many_steps.sh /tmp/many200000.parquet 100000   # FILE, the step that splits it for diff
set -u
file=$1
half=${2:-100000}
py=${PYTHON:-python}
run() {
    local name=$1; shift
    /usr/bin/time -f "$name: %e s wall, %U s user, %S s sys, %M KB peak RSS, exit %x" "$py" -m rollout_diag.cli "$@" \
        > /dev/null 2> >(tail -1 >&2)
    wait
}
run analyze analyze "$file"
run "analyze --all-steps" analyze "$file" --all-steps
run sweep sweep "$file"
run "sweep -f json" sweep "$file" -f json
run report report "$file" -o "${TMPDIR:-/tmp}/many-steps-report.html"
run compare-presets compare-presets "$file"
run "check --per-step" check "$file" --gates default --per-step
run "check --per-step -f json" check "$file" --gates default --per-step -f json
run diff diff "$file" --steps-a "0:$((half - 1))" --steps-b "$half:"
