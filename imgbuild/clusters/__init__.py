"""Where images go beyond one server: Slurm (sbatch scripts, OCI bundles for `srun --container`), Apptainer, Kubernetes
manifests and VS Code dev containers."""
