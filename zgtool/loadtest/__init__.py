"""Load tests driven by k6: find the binary, run zgtool's k6 scripts, convert the summary.

The scripts live in the repo's k6/ folder (package data when installed) and run with
plain k6 too; this package adds discovery, a progress bar and the result schema.
"""

from zgtool.loadtest.bench import RampResult, run_bench, run_ramp
from zgtool.loadtest.config import BenchConfig, RampConfig
from zgtool.loadtest.k6bin import find_k6
from zgtool.loadtest.summary import BenchResult, RampPath, ScenarioStats, Trend

__all__ = ["BenchConfig", "BenchResult", "RampConfig", "RampPath", "RampResult", "ScenarioStats", "Trend",
           "find_k6", "run_bench", "run_ramp"]
