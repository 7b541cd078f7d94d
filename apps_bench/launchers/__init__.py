"""The work of apps-bench's own Hydra launchers (their plugin classes, which Hydra finds, are in
hydra_plugins/apps_bench_launchers): `slurm` (submitit's, watched), `ray_cluster` (cells as Ray tasks)."""
