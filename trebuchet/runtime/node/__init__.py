"""What runs on a node: the node agent, its ranks, health checks, fault injection."""
