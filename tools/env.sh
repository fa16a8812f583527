# shellcheck shell=bash
# Source me: `source tools/env.sh` gives this shell the rad2 ROS 2 environment: the project venv
# active, the colcon install of ros2_ws sourced, rmw_fastrtps_cpp with the localhost Fast DDS
# profile, ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST and RAD2_ROOT. Safe under `set -u`.
# The variables themselves are defined once, in ros2_ws/src/rad2_ros/rad2_ros/rosenv.py.
if [ "${BASH_SOURCE[0]:-$0}" = "$0" ]; then
    echo "tools/env.sh must be sourced: source tools/env.sh" >&2
    exit 1
fi
_rad2_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_rad2_venv="${RAD2_VENV:-$_rad2_root/.venv}"
if [ ! -x "$_rad2_venv/bin/python" ] || [ ! -f "$_rad2_root/ros2_ws/install/setup.bash" ]; then
    echo "rad2: not bootstrapped yet; run: bash $_rad2_root/tools/bootstrap.sh" >&2
    unset _rad2_root _rad2_venv
    return 1
fi
# activate gives the prompt marker and `deactivate`; rosenv.py sets the same VIRTUAL_ENV and PATH.
# shellcheck disable=SC1091
source "$_rad2_venv/bin/activate"
# -S: skip site-packages, so the ROS wheels' startup hook does not re-exec python with its own
# additions, and the exports are computed against exactly this shell's environment.
if _rad2_exports="$("$_rad2_venv/bin/python" -S \
        "$_rad2_root/ros2_ws/src/rad2_ros/rad2_ros/rosenv.py" --shell)"; then
    eval "$_rad2_exports"
    unset _rad2_root _rad2_venv _rad2_exports
else
    unset _rad2_root _rad2_venv _rad2_exports
    return 1
fi
