"""Isolation of GPU shares: CUDA MPS, share environment, per-process memory watchdog."""
