"""dralloc: Kubernetes DRA allocation over NATS JetStream."""
