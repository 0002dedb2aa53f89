"""What the tests and the benchmarks share: the agent run as a process or in
process, the waits, the exposition parser, the Kubernetes API and kubelet
doubles, the pod harness and the soak. Neither tests/ nor bench/ imports the
other; both import this."""
