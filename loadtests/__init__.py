"""Locust suites for Triton and the load shapes shared with the simulator."""
