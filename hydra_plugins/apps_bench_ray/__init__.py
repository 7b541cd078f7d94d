"""apps-bench's Hydra launcher for Ray clusters (`hydra/launcher=ray_cluster`)."""
