"""The Kubernetes sources: the API server (pod names) and the kubelet (pod-resources)."""
