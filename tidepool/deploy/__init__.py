"""From one server to a cluster: NVIDIA's tritonserver container with Tidepool installed (container),
what a pod needs read from the planned configs (sizing), and the Kubernetes objects that run and
scale it (manifests, scaling)."""
