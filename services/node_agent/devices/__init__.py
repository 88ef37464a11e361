"""Device layer: GPU inventory and telemetry from NVML or simulated devices."""
