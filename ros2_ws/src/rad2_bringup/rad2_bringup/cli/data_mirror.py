"""Mirror a clip dataset left-right (y -> -y) into a new directory: recorded right-hand traffic as
left-hand traffic, to measure how much a policy relies on the side of the road it was trained on.

Every track, lane, boundary and polygon is reflected; headings and lateral velocities change sign; a
lane's left boundary, neighbour and lane-change permission become its right ones (rad2_datasets.mirror).
Clips are named ``<clip_id>_mirrored`` (mirroring a mirrored dataset gives the original clips back).
The output is written to ``<out>.partial`` and renamed when every clip was mirrored and validated.

examples:
  rad2 data mirror data/eval_real --out out/eval_real_mirrored
  rad2 eval experiments --arms ckpt:checkpoints/rad2_rl_real ref:pdm_closed --splits data/eval_real \\
      out/eval_real_mirrored --seeds 0 1 2 --workers 2 --out out/mirrored
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    ap = verb_parser("data mirror", __doc__)
    ap.add_argument("dataset", type=Path, help="dataset directory to mirror (index.json, clips/, maps/)")
    ap.add_argument("--out", type=Path, required=True, help="new dataset directory (must not exist)")
    args = ap.parse_args(argv)
    if not (args.dataset / "index.json").is_file():
        ap.error(f"dataset: {args.dataset} is not a dataset (no index.json)")
    if args.out.exists():
        ap.error(f"--out: {args.out} exists; mirror into a new directory")
    from rad2_core.field_checks import ClipValidationError
    from rad2_core.storage import read_index
    from rad2_datasets.mirror import mirror_dataset
    from tqdm import tqdm

    partial = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    total = len(read_index(args.dataset)["clips"])
    try:
        with tqdm(total=total, desc=f"mirroring {args.dataset.name}", unit="clip") as bar:
            n = mirror_dataset(args.dataset, partial, progress=bar.update)
    except (ClipValidationError, ValueError, OSError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        print(f"rad2 data mirror: error: {exc}; nothing was written to {args.out}", file=sys.stderr)
        return 1
    partial.rename(args.out)
    print(f"{args.out}: {n} clips, the mirror images of {args.dataset}")
    return 0
