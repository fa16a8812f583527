#!/usr/bin/env python3
"""Print the rad2 ROS 2 environment (venv, colcon install, Fast DDS on localhost); see
rad2_ros/rosenv.py, where it is defined (tools/env.sh runs that file directly)."""

import sys

from rad2_ros.rosenv import main

if __name__ == "__main__":
    sys.exit(main())
