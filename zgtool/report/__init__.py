"""HTML reports from zgtool result files (inline CSS + inline SVG, no external URL): load, verdict, recommend, svg, sections_*, html."""
