"""The Kubernetes backend: render, REST client, inventory, repartition, leases."""
