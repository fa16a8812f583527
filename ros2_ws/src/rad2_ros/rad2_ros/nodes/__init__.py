"""ROS 2 nodes: thin rclpy wrappers over the core modules."""
