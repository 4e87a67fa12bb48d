#!/usr/bin/env bash
# Builds the CPython interpreters of the agent's version matrix (3.9, 3.10, 3.12, 3.13, 3.14
# and the free-threaded 3.13t and 3.14t) into a cache outside the repository, one prefix each, so every
# line is at $CACHE/<name>/bin/python3. The sources are the upstream release tarballs that
# Debian's python3.X source packages carry (the .orig.tar.*, built as python.org ships it, not
# Debian's patched tree), so this needs Debian's source packages and apt: it is run by hand,
# not in CI. A line that no Debian suite has is taken from an interpreter already on the
# machine (pyenv first) and linked into the cache instead.  A line with neither (3.14 here: its
# orig tarball is not served) gets Debian sid's own build of it, installed by debootstrap into
# the root $CACHE/debian-sid with a compiler and the headers; that interpreter needs the root's
# newer C library, so scripts/matrix.sh runs that line inside the root (chroot, as root).
#
# Usage: scripts/build_pythons.sh [NAME...]      (default: all names above)
#   HOTSPAN_PYTHONS=DIR   cache directory (default ~/.cache/hotspan/pythons)
# As root it adds deb-src lines for the reachable Debian suites in
# /etc/apt/sources.list.d/hotspan-src.list and installs missing build dependencies.
# Downloads stay in $CACHE/src, build logs go to $CACHE/logs/<name>.log; an interpreter whose
# $CACHE/<name>/.built-from names the same tarball and sha256 is not rebuilt.
set -euo pipefail

CACHE=${HOTSPAN_PYTHONS:-$HOME/.cache/hotspan/pythons}
DEBIAN_ROOT=$CACHE/debian-sid
ALL_NAMES=(3.14 3.14t 3.13 3.13t 3.12 3.10 3.9)
SUITES=(bookworm bookworm-backports bullseye bullseye-backports trixie trixie-backports sid experimental)
SRC_LIST=/etc/apt/sources.list.d/hotspan-src.list
BUILD_DEPS=(build-essential pkg-config libssl-dev zlib1g-dev libffi-dev libbz2-dev libsqlite3-dev
            liblzma-dev libreadline-dev uuid-dev libgdbm-dev libncurses-dev)
APT_HELPER=/usr/lib/apt/apt-helper

case "${1:-}" in -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ALL_NAMES[@]}")
for n in "${names[@]}"; do
    [[ " ${ALL_NAMES[*]} " == *" $n "* ]] || { echo "unknown name: $n (known: ${ALL_NAMES[*]})" >&2; exit 2; }
done

is_root() { [ "$(id -u)" -eq 0 ]; }
have_apt() { command -v apt-cache >/dev/null 2>&1 && [ -x "$APT_HELPER" ]; }

# deb-src lines for every Debian suite the machine's own Debian mirror serves (a suite that
# is gone would make `apt-get update` fail, so each is probed first), then `apt-get update`.
setup_sources() {
    local site entry keyring="" opt="" suite tmp lines=""
    # shellcheck disable=SC2016  # $(SITE) is apt's format, not the shell's
    read -r site entry < <(apt-get indextargets --format '$(SITE) $(SOURCESENTRY)' 'Target-Of: deb' 2>/dev/null |
        grep -E '^[a-z]+://[^ ]*/debian/? ' | head -n 1) || true
    [ -n "${site:-}" ] || { echo "note: no Debian mirror in apt's sources; deb-src lines not added" >&2; return 0; }
    # Same Signed-By as the existing entry for that mirror, or apt refuses the conflict.
    [ -z "${entry:-}" ] || keyring=$(grep -ioE 'signed-by[:=] *[^] ]+' "${entry%:*}" | head -n 1 |
        sed -E 's/^signed-by[:=] *//I') || true
    [[ "$keyring" == /* ]] && opt="[signed-by=$keyring] "
    tmp=$(mktemp)
    for suite in "${SUITES[@]}"; do
        if "$APT_HELPER" download-file "${site%/}/dists/$suite/InRelease" "$tmp" >/dev/null 2>&1; then
            lines+="deb-src ${opt}${site%/} $suite main"$'\n'
        else
            echo "note: $suite not served by ${site%/}, left out" >&2
        fi
    done
    rm -f "$tmp"
    printf '# Written by hotspan scripts/build_pythons.sh: source indexes only.\n%s' "$lines" >"$SRC_LIST"
    apt-get update -qq || echo "warning: apt-get update failed; using the lists apt already has" >&2
}

# "VERSION SUITE" of each Debian source package python$1 in the configured suites, newest first.
debian_sources() {
    local sorted=() ver where i
    while read -r ver where; do
        i=0
        while [ "$i" -lt ${#sorted[@]} ] && dpkg --compare-versions "${sorted[i]%% *}" ge "$ver"; do i=$((i + 1)); done
        sorted=("${sorted[@]:0:i}" "$ver ${where%%/*}" "${sorted[@]:i}")
    done < <(apt-cache madison "python$1" 2>/dev/null | awk -F'|' '$3 ~ / Sources *$/ {
        gsub(/ /, "", $2); split($3, a, " "); print $2, a[2] }')
    [ ${#sorted[@]} -eq 0 ] || printf '%s\n' "${sorted[@]}"
}

# Downloads the .orig tarball of python$1=$2 into $CACHE/src (checked against the sha256 in
# apt's signed index); prints "PATH SHA256".
fetch_orig() {
    local uri file hash dest
    read -r uri file _ hash < <(apt-get source --print-uris "python$1=$2" 2>/dev/null |
        awk '$2 ~ /\.orig\.tar\./ { gsub(/\x27/, "", $1); print; exit }') || true
    [ -n "${hash:-}" ] || { echo "no orig tarball listed for python$1=$2" >&2; return 1; }
    dest=$CACHE/src/$file
    if [ ! -f "$dest" ] || [ "$(sha256sum "$dest" | cut -d' ' -f1)" != "${hash#SHA256:}" ]; then
        rm -f "$dest"
        "$APT_HELPER" -o APT::Sandbox::User="$(id -un)" download-file "$uri" "$dest" "$hash" >/dev/null 2>&1 ||
            { rm -f "$dest"; return 1; }
    fi
    echo "$dest ${hash#SHA256:}"
}

install_build_deps() {
    local missing=() p
    for p in "${BUILD_DEPS[@]}"; do
        dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    if is_root; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "warning: missing build dependencies (not root, not installed): ${missing[*]}" >&2
    fi
}

# Builds $1 from tarball $2 into $CACHE/$1; a && chain, so a failing step stops it under any
# caller (set -e is off inside a function called from `if`).
build_one() {
    local name=$1 tarball=$2 line=${1%t} suffix=${1#"${1%t}"} work=$CACHE/build/$1 prefix=$CACHE/$1
    local flags=(--prefix="$prefix" --with-ensurepip=install)
    [ -z "$suffix" ] || flags+=(--disable-gil)
    rm -rf "$work" && mkdir -p "$work" &&
        tar -xf "$tarball" -C "$work" --strip-components=1 &&
        (cd "$work" && ./configure "${flags[@]}" && make -j"$(nproc)" && rm -rf "$prefix" && make install) &&
        { [ -e "$prefix/bin/python3" ] || ln -s "python$line$suffix" "$prefix/bin/python3"; } &&
        rm -rf "$work"
}

# Debian sid's build of python$1 in $DEBIAN_ROOT (made by debootstrap on first use): prints
# its version.  Needs root and debootstrap.
debian_root_python() {
    local line=$1 pkgs="python$1,python$1-dev,python$1-venv,gcc,libc6-dev"
    is_root || return 1
    command -v debootstrap >/dev/null 2>&1 ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 || return 1
    if [ ! -x "$DEBIAN_ROOT/usr/bin/python$line" ]; then
        if [ -x "$DEBIAN_ROOT/usr/bin/apt-get" ]; then
            chroot "$DEBIAN_ROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                "python$line" "python$line-dev" "python$line-venv" >/dev/null 2>&1 || return 1
        else
            rm -rf "$DEBIAN_ROOT"
            debootstrap --variant=minbase --include="$pkgs" sid "$DEBIAN_ROOT" \
                http://deb.debian.org/debian >"$CACHE/logs/debian-sid.log" 2>&1 || return 1
        fi
    fi
    chroot "$DEBIAN_ROOT" "/usr/bin/python$line" -c 'import platform; print(platform.python_version())'
}

check_python() { "$1" -c 'import ssl, zlib, ctypes, sqlite3' >/dev/null 2>&1; }
py_version() { "$1" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo "?"; }

# An interpreter of line $1 already on the machine (pyenv first), newest patch release first.
find_existing() {
    local line=${1%t} suffix=${1#"${1%t}"} d c
    while read -r d; do
        [ -n "$d" ] || continue
        [ -n "$suffix" ] || [[ "$d" != *t ]] || continue
        c=$d/bin/python$line$suffix
        [ -x "$c" ] && check_python "$c" && { echo "$c"; return 0; }
    done < <(printf '%s\n' "${PYENV_ROOT:-$HOME/.pyenv}/versions/$line".* | sort -rV)
    for c in "/usr/local/bin/python$line$suffix" "/usr/bin/python$line$suffix"; do
        [ -x "$c" ] && check_python "$c" && { echo "$c"; return 0; }
    done
    return 1
}

mkdir -p "$CACHE/src" "$CACHE/logs"
if have_apt && is_root; then setup_sources; fi

declare -A VERSION HOW STATUS SECS
failed=0 deps_done=""
for name in "${names[@]}"; do
    line=${name%t} prefix=$CACHE/$name py=$CACHE/$name/bin/python3 log=$CACHE/logs/$name.log
    SECS[$name]=-
    got="" tried="" new_stamp=""
    if have_apt; then
        # The newest version whose tarball the mirror really serves (an index can list more).
        while read -r debver suite; do
            [ -n "$debver" ] || continue
            if got=$(fetch_orig "$line" "$debver" </dev/null); then break; fi
            tried+=" $debver ($suite)"
        done < <(debian_sources "$line")
    fi
    [ -z "$tried" ] || echo "note: python$line: Debian lists$tried but its orig tarball could not be downloaded" >&2
    if [ -n "$got" ]; then
        upstream=${debver#*:} upstream=${upstream%-*}
        VERSION[$name]=$upstream HOW[$name]="built from Debian $suite orig tarball"
        read -r tarball sha <<<"$got"
        stamp="$(basename "$tarball") $sha"
        if [ -x "$py" ] && [ "$(cat "$prefix/.built-from" 2>/dev/null)" = "$stamp" ]; then
            HOW[$name]+=" (cached)"
        else
            [ -n "$deps_done" ] || { install_build_deps; deps_done=1; }
            echo "== building $name ($upstream, Debian $suite) -> $prefix, log $log"
            start=$SECONDS
            if build_one "$name" "$tarball" >"$log" 2>&1; then
                SECS[$name]=$((SECONDS - start)) new_stamp=$stamp
            else
                SECS[$name]=$((SECONDS - start))
                echo "!! build of $name failed; last lines of $log:"; tail -n 40 "$log"
                STATUS[$name]=failed failed=1; continue
            fi
        fi
    elif [ -x "$py" ] && [ -f "$prefix/.built-from" ]; then
        VERSION[$name]=$(py_version "$py") HOW[$name]="kept, built earlier from $(cut -d' ' -f1 "$prefix/.built-from")"
    elif found=$(find_existing "$name"); then
        rm -rf "$prefix" && mkdir -p "$prefix/bin" && ln -s "$found" "$py"
        VERSION[$name]=$(py_version "$found") HOW[$name]="found at $found (not built)"
    elif [ "$name" = "$line" ] && found=$(debian_root_python "$line"); then
        VERSION[$name]=$found HOW[$name]="Debian sid's build in $DEBIAN_ROOT (no source tarball${tried:+: $tried})"
        STATUS[$name]=ok
        continue
    else
        VERSION[$name]=- HOW[$name]="no Debian source${tried:+ (listed but not downloadable:$tried)}, none on this machine"
        STATUS[$name]=failed failed=1; continue
    fi
    if check_python "$py"; then
        STATUS[$name]=ok
        [ -z "$new_stamp" ] || printf '%s\n' "$new_stamp" >"$prefix/.built-from"
    else
        echo "!! $py cannot import ssl, zlib, ctypes and sqlite3"; STATUS[$name]=failed failed=1
    fi
done

echo
printf '%-6s %-9s %-8s %-6s %s\n' NAME VERSION STATUS BUILD_S "HOW OBTAINED"
for name in "${names[@]}"; do
    printf '%-6s %-9s %-8s %-6s %s\n' "$name" "${VERSION[$name]:-?}" "${STATUS[$name]:-?}" \
        "${SECS[$name]}" "${HOW[$name]:-?}"
done
echo "interpreters: $CACHE/<name>/bin/python3"
exit "$failed"
