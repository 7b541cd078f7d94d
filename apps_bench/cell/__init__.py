"""One cell, in the order it runs: its key and the grid guard (`key`), the spine (`pipeline`: prepare ->
solve every problem -> finish), the engine opened once (`engine`), the per-problem step (`step`: solve ->
judge -> record), the solve itself (`solving`) in this process or in forkserver workers (`solver_pool`),
the event loop's quiet teardown (`event_loop`), the CPUs the cell was given (`cpus`) and the agent
frameworks its topology runs on (`frameworks`: data, so provenance and re-scoring load no runner).
"""
