#!/usr/bin/env bash
# The tests that time anything, run beside CPU-burning processes: a busy shared machine on purpose.
#
#   scripts/stress.sh                         # those tests once, beside two burners
#   scripts/stress.sh --repeat 3              # three times in a row; stops at the first failing run
#   scripts/stress.sh --burners 4 tests/test_live_verdicts.py -k slowdown   # files and pytest options
#
# Without test files it picks the test modules that sleep, read a clock, pin threads, or start
# processes (the pattern below): a new timing test is picked up without being listed here.
# Run scripts/setup_env.sh (or scripts/test.sh) once first; PYTHON overrides .venv/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
TIMING='time\.sleep|perf_counter|monotonic|one_thread|Popen|delay_s|SlowdownConfig|StallConfig'
repeat=1
burners=2
args=()
while (($#)); do
    case $1 in
        --repeat) repeat=$2; shift 2 ;;
        --burners) burners=$2; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
files=()
for arg in "${args[@]+"${args[@]}"}"; do
    [[ $arg == tests/* || $arg == */tests/* ]] && files+=("$arg")
done
if ((${#files[@]} == 0)); then
    mapfile -t files < <(grep -lE "$TIMING" tests/test_*.py)
    args=("${files[@]}" "${args[@]+"${args[@]}"}")
fi

pids=()  # the burners and the running pytest: stopped with this script, however it ends
stop_children() { ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null || true; }
trap stop_children EXIT
trap 'exit 143' TERM INT HUP  # through the EXIT trap: a killed stress run leaves no pytest behind
for _ in $(seq "$burners"); do
    sh -c 'while :; do :; done' &
    pids+=($!)
done
echo "stress: $burners CPU burners beside ${#files[@]} test file(s), $repeat run(s)"
for run in $(seq "$repeat"); do
    start=$(date +%s)
    "$PYTHON" -m pytest -q -p no:cacheprovider "${args[@]}" &
    pids+=($!)
    if ! wait "${pids[-1]}"; then
        echo "stress: run $run of $repeat failed after $(($(date +%s) - start)) s"
        exit 1
    fi
    unset 'pids[-1]'
    echo "stress: run $run of $repeat passed in $(($(date +%s) - start)) s"
done
