"""Analysis: statistics over measured samples (phases, intervals, the gateway tax, study design, open-loop
schedule keeping, saturation). Measurement only, no rendering."""
