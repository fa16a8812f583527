"""rad2 planner core: clips, BEV features, networks, policy, control. Imports no ROS."""
