"""`zgtool latency-split`: per-phase latency decomposition with server-side attribution.

model (config, samples), client (one traced request), runner (rounds over targets),
analysis (attribution, statistics, gateway tax), render (terminal). Import submodules
directly; this package imports nothing so the CLI stays fast.
"""
