#!/usr/bin/env bash
# Installs everything the test suite needs, then runs all of it (lint included).
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's externally-managed Python refuses plain pip installs; this is a test machine.
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# Go brings `go tool pprof` (a real pprof reader) and runtime/pprof (a real producer);
# Chromium runs the UI tests (Playwright drives it; Playwright's own browser download is not
# used); valgrind runs the agent where the heap sits low (tests/agent/test_code_lifetime.py).
missing=()
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export HOTSPAN_REQUIRE_BROWSER=1

python3 -m pip install -q -e ".[test]"
# The suite starts hundreds of Python processes (servers, agents, the CLI) on this source
# tree: compiled once here, none of them compiles it again (a fresh clone has no bytecode, and
# with PYTHONDONTWRITEBYTECODE set, as in CI, each of them would).
python3 -m compileall -q -j 0 src >/dev/null
# pytest rewrites each test module's asserts as it imports it, in every worker of every phase
# below (11 s to collect the suite in one process, 3.4 s with the rewritten modules kept), and
# keeps them beside the modules as bytecode, which PYTHONDONTWRITEBYTECODE forbids: allowed
# here, and written once by a collection beside the lint (which leaves a core idle).
unset PYTHONDONTWRITEBYTECODE
python3 -m pytest --collect-only -q >/dev/null 2>&1 &
collecting=$!
# Lint, format and type checks first (ruff, ruff format, mypy, eslint, prettier,
# clang-format): seconds once its tools are installed, and a failure stops here.
bash scripts/lint.sh
wait "$collecting" || true  # a module that fails to import fails below, with its error
# Without arguments (CI): everything but the timing tests in four pytest-xdist workers, each
# taking a whole test file at a time (module-scoped servers stay shared), the longest files
# first (tests/conftest.py).  The suite waits much of its time (servers starting, alert
# evaluations, the browser, deadlines): on two cores, two workers left the cores 30% idle and
# three 15% (426 s); four fill them (374 s), and a fifth gains nothing (380 s).  Then the
# tests marked `timing` on their own, two files at a time: they judge sampling, overhead or a
# span's CPU share against the clocks, which the rest of the suite beside them would skew
# (the busy-program checks missed by a percent), while two of them side by side still pass
# (their programs mostly wait, and each check is against the CPU the program really got),
# the longest files first, in tests/conftest.py's order (xdist's own orders files by
# their number of tests, which can leave a minute-long file for last).
# With arguments: pytest with those arguments, in one process.
if [ $# -gt 0 ]; then
    exec python3 -m pytest "$@"
fi
status=0
# Coverage-guided fuzzing (atheris) of what decodes uploads: pprof (the C decoder against its
# Python twin), JFR and OTLP traces (their C readers against the Python ones), OTLP profiles,
# the stacks of folded, lines, speedscope, trie and tree uploads, and the gzip, multipart and
# Connect bodies in front of them.  Its own step, not a pytest test:
# the fuzzer wants the cores for a fixed wall time (60 s here, two targets at a time, before
# the suite starts; beside the first pytest phase, even at the lowest priority, it slowed that
# phase by more than the minute it saved), and a finding should read as one.  A finding lands
# in tests/fuzz/crashes/<target>/ (commit it with the fix), which
# tests/formats/test_fuzz_crashes.py replays on every run.  atheris comes with the test extra
# where it has wheels (CPython 3.11-3.13 on x86-64 Linux); elsewhere the step says it is
# skipped.
if python3 -c "import atheris" 2>/dev/null || python3 -m pip install -q "atheris>=2.3"; then
    python3 tests/fuzz/run.py --seconds 60 --jobs 2 || status=$?
else
    echo "fuzz: skipped (atheris does not install on $(python3 --version))"
fi
python3 -m pytest -n "${HOTSPAN_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder \
    -m "not timing" || status=$?
# The timing tests alone: the agent's (tests/agent/conftest.py), two files at a time.
python3 -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m timing tests/agent \
    || status=$?
# Then, one file at a time (25 s), the "why" modules' and the trace badges' GIL one: their
# verdicts follow how long a span waited for the GIL or for a core beside its own process's
# busy threads, which another file's busy threads would change (a thread of theirs holding
# the GIL without a core makes the span's wait for a core read as a wait for the GIL).
python3 -m pytest -m timing tests/server/api/test_why.py \
    tests/server/api/test_why_contended_service.py tests/ui/test_why_ui.py \
    tests/ui/test_trace_badges_ui.py || status=$?
exit "$status"
