"""Runtimes carry out task launches: simulated, local process, Kubernetes Pod."""
