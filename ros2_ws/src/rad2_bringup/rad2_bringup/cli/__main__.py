"""``python -m rad2_bringup.cli ...`` is ``rad2 ...`` (how tests, bench_gpu.sh and the re-execution in the
ROS environment run it without the installed script)."""

import sys

from rad2_bringup.cli import main

sys.exit(main())
