"""Drivers: the one run loop and what runs it (local controller, Kubernetes controller, demo, profile)."""
