"""GPU telemetry: samples, the simulated workload, the ring and the rollups (pure), and the relay."""
