#!/usr/bin/env bash
# The agent on every CPython found here: for each interpreter, a fresh venv with the project
# installed (its C extensions built by that interpreter), the agent's tests (sampler, span and
# asyncio labels, allocation/heap/lock/thread profiles, fork, the pprof writer), and a smoke run
# of `hotspan run` pushing to a real `hotspan server`.  Interpreters come from the cache that
# scripts/build_pythons.sh fills ($HOTSPAN_PYTHONS, default ~/.cache/hotspan/pythons/<name>)
# and the machine's own python3; a line with none is reported as skipped.  CI runs only the
# machine's Python (the others need sources it does not have).
#
# Usage: bash scripts/matrix.sh [NAME...]   (default: 3.9 3.10 3.11 3.12 3.13 3.13t 3.14 3.14t)
# Prints a table (version x passed/failed/skipped) and writes it to bench/results/matrix.md;
# each line's log is in $WORK/<name>.log (WORK defaults to /tmp/hotspan-matrix).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${HOTSPAN_PYTHONS:-$HOME/.cache/hotspan/pythons}
WORK=${HOTSPAN_MATRIX_WORK:-/tmp/hotspan-matrix}
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(3.9 3.10 3.11 3.12 3.13 3.13t 3.14 3.14t)
AGENT_TESTS=(
    tests/test_agent_sampler.py tests/test_agent_span_linking.py tests/test_agent.py
    tests/test_agent_alloc.py tests/test_agent_locks.py tests/test_agent_threads.py
    tests/test_agent_pprof.py tests/test_agent_symbols.py tests/test_agent_busy.py
)
mkdir -p "$WORK"

# The interpreter of line $1: the cache's, else (for the machine's own line) python3.
interpreter() {
    local name=$1 own
    if [ -x "$CACHE/$name/bin/python3" ]; then
        echo "$CACHE/$name/bin/python3"
        return 0
    fi
    own=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$name" = "$own" ] && python3 -c 'import sys; sys.exit(hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled())'; then
        command -v python3
        return 0
    fi
    return 1
}

declare -A RESULT DETAIL VERSION
for name in "${NAMES[@]}"; do
    log=$WORK/$name.log
    if ! py=$(interpreter "$name"); then
        RESULT[$name]=skipped
        DETAIL[$name]="no interpreter (scripts/build_pythons.sh $name builds it)"
        continue
    fi
    VERSION[$name]=$("$py" -c 'import platform, sys; print(platform.python_version() + ("t" if hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled() else ""))')
    echo "== $name (${VERSION[$name]}): $py" | tee "$log"
    venv=$WORK/venv-$name
    rm -rf "$venv"
    # pip 26 and setuptools 84 need 3.10+, and an index without Requires-Python offers them to
    # 3.9's old pip anyway: the bound keeps every line on a pip that installs there.
    if ! { "$py" -m venv "$venv" && "$venv/bin/python" -m pip install -q --upgrade "pip<26" &&
        "$venv/bin/python" -m pip install -q -e "${ROOT}[test]"; } >>"$log" 2>&1; then
        RESULT[$name]=failed
        DETAIL[$name]="install failed (see $log)"
        continue
    fi
    native=$("$venv/bin/python" -c 'from hotspan._speedups import load_sampler, load_module; print("native" if load_sampler() and load_module("_alloc") else "pure-Python fallback")' 2>>"$log")
    (cd "$ROOT" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "${AGENT_TESTS[@]}") >>"$log" 2>&1
    tests=$?
    summary=$(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$log" | tail -1)
    "$venv/bin/python" "$ROOT/scripts/matrix_smoke.py" >>"$log" 2>&1
    smoke=$?
    if [ $tests -eq 0 ] && [ $smoke -eq 0 ]; then RESULT[$name]=passed; else RESULT[$name]=failed; fi
    DETAIL[$name]="$native; tests: ${summary:-none ran}; hotspan run: $([ $smoke -eq 0 ] && echo ok || echo FAILED)"
done

{
    echo "| CPython | result | detail |"
    echo "| --- | --- | --- |"
    for name in "${NAMES[@]}"; do
        echo "| ${VERSION[$name]:-$name} | ${RESULT[$name]} | ${DETAIL[$name]} |"
    done
} | tee "$WORK/matrix.md"
mkdir -p "$ROOT/bench/results"
{
    echo "# The agent's version matrix"
    echo
    echo "Command: \`bash scripts/matrix.sh\`; $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD)."
    echo
    cat "$WORK/matrix.md"
} >"$ROOT/bench/results/matrix.md"
for name in "${NAMES[@]}"; do [ "${RESULT[$name]}" != failed ] || exit 1; done
