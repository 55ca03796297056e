#!/usr/bin/env bash
# Set everything up (idempotent), lint (ruff + mypy over every package) and run the test suite.
# .ci/run calls exactly this. Either failing fails the command; the tests run even when lint fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
bash scripts/lint.sh
lint_rc=$?
workers="${ZGTOOL_TEST_WORKERS:-2}"
if [ "$workers" = 0 ]; then      # one process, as before
  .venv/bin/python -m pytest -q "$@"
  rc=$?
else
  # two workers, each taking whole test files (a file's module fixtures start once): the suite's live
  # tests mostly wait on servers they start, so two overlap well on 2 cores (about 13 minutes here
  # against 20-22 in one process). The tests marked `serial` assert what a client that keeps up sees
  # (no lag flagged, clocks against the wire): they run after the rest, alone, where another worker
  # cannot load the cores under them.
  .venv/bin/python -m pytest -q -n "$workers" --dist loadfile -m "not serial" "$@"
  rc=$?
  .venv/bin/python -m pytest -q -m serial "$@"
  serial_rc=$?
  # 5 is pytest's "no tests collected": only a failure when neither part ran a test
  if [ $rc -eq 5 ]; then rc=$serial_rc
  elif [ $serial_rc -ne 0 ] && [ $serial_rc -ne 5 ]; then rc=$serial_rc
  fi
fi
set -e
[ $lint_rc -ne 0 ] && echo "test: lint (ruff/mypy) failed" >&2
# pytest's 5 means "no tests collected": a failure for us, not a pass
[ $rc -ne 0 ] && exit $rc
exit $lint_rc
