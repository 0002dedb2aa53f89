"""Which pod a GPU process belongs to (cgroups, /proc) and what the pod is called (the directory)."""
