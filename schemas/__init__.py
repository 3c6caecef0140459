"""The contract: the resource.k8s.io/v1 object model and the bus events."""
