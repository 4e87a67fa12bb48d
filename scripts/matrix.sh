#!/usr/bin/env bash
# The agent on every CPython found here: for each interpreter, a fresh venv with the project
# installed (its C extensions built by that interpreter, with the compiler's warnings counted),
# the agent's tests (sampler, frame and code object lifetimes, span and asyncio labels,
# allocation/heap/lock/thread profiles, fork, the pprof writer, busy programs), and a smoke run
# of `hotspan run` pushing to a real `hotspan server`.  Interpreters come from the cache that
# scripts/build_pythons.sh fills ($HOTSPAN_PYTHONS, default ~/.cache/hotspan/pythons/<name>),
# the machine's own python3, and, for a line no source tarball could be had for (3.14 here),
# the Debian root that build_pythons.sh makes with Debian's own build of it: the line's run
# then happens inside that root (chroot, in a private mount namespace), since its interpreter
# needs that root's C library.  A line with none of these is reported as skipped.  CI runs
# only the machine's Python (the others need sources it does not have).
#
# Usage: bash scripts/matrix.sh [NAME...]   (default: 3.9 3.10 3.11 3.12 3.13 3.13t 3.14 3.14t)
#        bash scripts/matrix.sh --table [NAME...]   (the table of the last runs, running nothing)
# Prints a table (version x passed/failed/skipped) and writes it to bench/results/matrix.md;
# each line's log is in $WORK/<name>.log (WORK defaults to /tmp/hotspan-matrix).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${HOTSPAN_PYTHONS:-$HOME/.cache/hotspan/pythons}
WORK=${HOTSPAN_MATRIX_WORK:-/tmp/hotspan-matrix}
DEBIAN_ROOT=$CACHE/debian-sid
AGENT_TESTS=(
    tests/agent/test_sampler.py tests/agent/test_frame_lifetime.py tests/agent/test_code_lifetime.py
    tests/agent/test_span_linking.py tests/agent/test_agent.py tests/agent/test_alloc.py
    tests/agent/test_locks.py tests/agent/test_threads.py tests/agent/test_pprof.py
    tests/agent/test_symbols.py tests/agent/test_busy.py tests/agent/test_busy_server.py
    tests/agent/test_gil.py tests/agent/test_gc_frame.py tests/agent/test_attach.py
    tests/agent/test_turns.py tests/agent/test_transport.py tests/agent/test_uploader.py
)
mkdir -p "$WORK"

# Whether interpreter $1 runs without the GIL (a free-threaded build, GIL not forced back on).
free_threaded() {
    "$1" -c 'import sys; sys.exit(not (hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled()))'
}

# The interpreter of line $1: the cache's; inside the Debian root, that root's; else (for the
# machine's own line) python3.
interpreter() {
    local name=$1 own
    if [ -x "$CACHE/$name/bin/python3" ]; then
        echo "$CACHE/$name/bin/python3"
        return 0
    fi
    if [ -n "${HOTSPAN_MATRIX_IN_ROOT:-}" ] && [ -x "/usr/bin/python$name" ]; then
        echo "/usr/bin/python$name"
        return 0
    fi
    own=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$name" = "$own" ] && ! free_threaded python3; then
        command -v python3
        return 0
    fi
    return 1
}

# Runs line $1 with interpreter $2; writes "RESULT<TAB>VERSION<TAB>DETAIL" to $WORK/$1.result.
run_line() {
    local name=$1 py=$2 log=$WORK/$1.log venv=$WORK/venv-$1 version native warnings tests smoke
    local summary result
    local free_threaded="" server_env=()
    free_threaded "$py" && free_threaded=1
    version=$("$py" -c 'import platform; print(platform.python_version())')${free_threaded:+t}
    echo "== $name ($version): $py" | tee "$log"
    rm -rf "$venv"
    if [ -n "$free_threaded" ]; then
        # Free-threaded: the agent and what its tests import (uvicorn with httptools and
        # uvloop, as the test extra has them: with h11 a request waits out a delayed ACK).
        # The server's DuckDB (and the Pyroscope SDK the test extra brings) have no
        # free-threaded build, so the tests' server runs on the machine's python3, which must
        # have hotspan installed.
        if ! python3 -c 'import hotspan.server, duckdb' 2>/dev/null; then
            printf 'skipped\t%s\tfree-threaded: its tests need a hotspan server on python3 (pip install -e .)\n' \
                "$version" >"$WORK/$name.result"
            return
        fi
        server_env=(HOTSPAN_TEST_SERVER_PYTHON="$(command -v python3)")
    fi
    # pip 26 and setuptools 84 need 3.10+, and an index without Requires-Python offers them to
    # 3.9's old pip anyway: the bound keeps every line on a pip that installs there.  -v shows
    # the compiler's output, whose warnings are counted.
    if ! { "$py" -m venv "$venv" && "$venv/bin/python" -m pip install -q --upgrade "pip<26" &&
        if [ -n "$free_threaded" ]; then
            "$venv/bin/python" -m pip install -v --no-deps -e "$ROOT" &&
                "$venv/bin/python" -m pip install protobuf numpy pytest httpx opentelemetry-api \
                    opentelemetry-sdk opentelemetry-exporter-otlp-proto-http uvicorn starlette \
                    httptools uvloop
        else
            "$venv/bin/python" -m pip install -v -e "${ROOT}[test]"
        fi; } >>"$log" 2>&1; then
        printf 'failed\t%s\tinstall failed (see %s)\n' "$version" "$log" >"$WORK/$name.result"
        return
    fi
    # hotspan's own sources only: a dependency built from source where no wheel fits (gevent
    # on 3.9.2) brings warnings of its own.
    warnings=$(grep -cE '_speedups/[^ ]*\.[ch]:[0-9]+:[0-9]+: warning:' "$log")
    native=$("$venv/bin/python" -c 'from hotspan._speedups import load_sampler, load_module, native_unavailable_reason as r; print(("native" if load_module("_alloc") else "native sampler, no allocator hook") if load_sampler() else "pure-Python fallback (" + r() + ")")' 2>>"$log")
    (cd "$ROOT" && env "${server_env[@]}" "$venv/bin/python" -m pytest -q -p no:cacheprovider "${AGENT_TESTS[@]}") >>"$log" 2>&1
    tests=$?
    summary=$(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$log" | tail -1)
    env "${server_env[@]}" "$venv/bin/python" "$ROOT/scripts/matrix_smoke.py" >>"$log" 2>&1
    smoke=$?
    if [ $tests -eq 0 ] && [ $smoke -eq 0 ] && [ "$warnings" -eq 0 ]; then result=passed; else result=failed; fi
    printf '%s\t%s\t%s; C warnings: %s; tests: %s; hotspan run: %s%s\n' "$result" "$version" \
        "$native" "$warnings" "${summary:-none ran}" "$([ $smoke -eq 0 ] && echo ok || echo FAILED)" \
        "${HOTSPAN_MATRIX_IN_ROOT:+ (Debian sid build, in its own root)}" >"$WORK/$name.result"
}

# Runs line $1 inside the Debian root: this checkout and $WORK mounted at the same paths, in a
# mount namespace of its own so that nothing stays mounted afterwards.
run_in_root() {
    local name=$1
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private bash -c '
        set -e
        r=$1 root=$2 work=$3 name=$4
        mkdir -p "$r$root" "$r$work" "$r/proc" "$r/dev" "$r/sys"
        mount --bind "$root" "$r$root"
        mount --bind "$work" "$r$work"
        mount -t proc proc "$r/proc"
        mount --rbind /dev "$r/dev"
        mount --rbind /sys "$r/sys"
        cp /etc/resolv.conf "$r/etc/resolv.conf"
        # The machine'"'"'s certificate authorities (a proxy'"'"'s own, where there is one).
        cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/host-ca-certificates.crt"
        exec chroot "$r" env HOME=/root PATH=/usr/local/bin:/usr/bin:/bin \
            PIP_CERT=/etc/ssl/certs/host-ca-certificates.crt \
            SSL_CERT_FILE=/etc/ssl/certs/host-ca-certificates.crt \
            HOTSPAN_MATRIX_IN_ROOT=1 HOTSPAN_MATRIX_WORK="$work" \
            bash "$root/scripts/matrix.sh" --line "$name"
    ' _ "$DEBIAN_ROOT" "$ROOT" "$WORK" "$name"
}

if [ "${1:-}" = "--line" ]; then # one line, inside the Debian root
    py=$(interpreter "$2") || { printf 'failed\t%s\tno interpreter in the root\n' "$2" >"$WORK/$2.result"; exit 1; }
    run_line "$2" "$py"
    exit 0
fi

TABLE_ONLY=""
if [ "${1:-}" = "--table" ]; then # the table of the lines' last runs, from $WORK, no run
    TABLE_ONLY=1
    shift
fi
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(3.9 3.10 3.11 3.12 3.13 3.13t 3.14 3.14t)
declare -A RESULT DETAIL VERSION
for name in "${NAMES[@]}"; do
    if [ -n "$TABLE_ONLY" ]; then
        :
    elif rm -f "$WORK/$name.result" && py=$(interpreter "$name"); then
        run_line "$name" "$py"
    elif [ -x "$DEBIAN_ROOT/usr/bin/python$name" ] && [ "$(id -u)" -eq 0 ]; then
        run_in_root "$name" >>"$WORK/$name.root.log" 2>&1
    else
        RESULT[$name]=skipped
        DETAIL[$name]="no interpreter (scripts/build_pythons.sh $name builds it)"
        continue
    fi
    if [ -f "$WORK/$name.result" ]; then
        IFS=$'\t' read -r RESULT[$name] VERSION[$name] DETAIL[$name] <"$WORK/$name.result"
    elif [ -n "$TABLE_ONLY" ]; then
        RESULT[$name]=skipped
        DETAIL[$name]="not run (no $WORK/$name.result)"
    else
        RESULT[$name]=failed
        DETAIL[$name]="no result (see $WORK/$name.log and $WORK/$name.root.log)"
    fi
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
