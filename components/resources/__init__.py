"""The ComponentResources: each registers what planning produced for one part of the cluster."""
