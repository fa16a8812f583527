"""BEV-Warp closed-loop simulator: warping, safety, rewards, metrics. Imports no ROS."""
