"""GPUs without Docker: reading them (NVML, nvidia-smi, snapshots, through the engine), choosing them for a run,
and judging whether an image runs on them (fleet)."""
