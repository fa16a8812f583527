"""rad2 closed-loop reinforcement learning (plain Python, no ROS): distributed rollouts, curation, RL."""
