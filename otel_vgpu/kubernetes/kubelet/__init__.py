"""The kubelet pod-resources API: the .proto and the modules generated from it."""
