"""The local backend: tritonserver replicas, nginx, Prometheus and process groups on one machine."""
