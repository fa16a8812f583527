#!/usr/bin/env python3
"""Convert Waymo Open Motion Dataset scenario TFRecords into a rad2 clip dataset (no TensorFlow needed).

Examples:
  tools/convert_womd.py ~/womd/validation/validation.tfrecord-00000-of-00150 --out out/womd_val
  tools/convert_womd.py ~/womd/validation --out out/womd_val --limit 200 --skip-bad
  tools/convert_womd.py shard.tfrecord --out out/womd --append

The WOMD-only form of tools/convert_logs.py (``--format womd``), which takes the same options: each
Scenario record becomes one clip (the SDC is the ego) at the simulator's step (params/sim.yaml sim.dt);
conversion parameters are params/bev.yaml adapters.* (see adapters/womd.py). Record CRCs are checked
unless --no-verify-crc. Output: index.json, clips/<clip_id>.npz, maps/<map_id>.npz.
"""

from __future__ import annotations

import sys

from convert_logs import main as convert_logs_main


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__)
    return convert_logs_main([*argv, "--format", "womd"])  # last: --format takes several values


if __name__ == "__main__":
    from rad2_core.cli_args import run_tool

    sys.exit(run_tool(main, "convert_womd"))
