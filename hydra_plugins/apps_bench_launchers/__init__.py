"""apps-bench's Hydra launchers (Hydra instantiates launchers only from `hydra_plugins`).

Hydra imports this package at every start to discover plugins: it stays light, and the
work lives in `apps_bench.launchers`.
"""
