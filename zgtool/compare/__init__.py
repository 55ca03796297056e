"""`zgtool compare`: the same metrics across several latency-split runs.

    runs.py     read result files, refuse ones that cannot be compared (schema, kind, workload, paths)
    stats.py    between-run t-intervals over run medians, the tax per hop per run, the regression table
    render.py   the terminal tables and the Markdown summary (rendering only)
    plots.py    PNG and SVG figures (matplotlib, the `plots` extra; imported only when asked)
"""
