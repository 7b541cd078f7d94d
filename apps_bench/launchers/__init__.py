"""Hydra launchers of apps-bench's own (conf/hydra/launcher/*.yaml name them in `_target_`)."""
