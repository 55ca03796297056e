"""Rendering: terminal output of analysed results (split waterfall and table, join, open loop, sweep,
field lines). Nothing here measures or computes statistics."""
