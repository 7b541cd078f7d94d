"""The cell's settings: the schema and its composition (`schema`), the command line's overrides
checked before Hydra composes them (`overrides`), the composed settings' ranges and choices (`validate`).
"""
