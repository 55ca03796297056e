"""`zgtool verify`: start the engine and a gateway path side by side, measure both with every
probe, write every result plus report.html into one folder, and print the verdict.

plan (config and the numbers of a run), stages (one measuring step each), sampler (engine/GPU
timeline in the background), engine_metrics (the "engine.metrics" snapshot), run (the
orchestration), summary (terminal rendering). Import submodules directly.
"""
