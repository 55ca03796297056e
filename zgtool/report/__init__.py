"""HTML reports from result files."""
