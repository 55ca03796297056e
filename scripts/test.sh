#!/usr/bin/env bash
# Set everything up (idempotent), lint (ruff + mypy over every package) and run the test suite.
# .ci/run calls exactly this. Either failing fails the command; the tests run even when lint fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
bash scripts/lint.sh
lint_rc=$?
# two workers, each taking whole test files (a file's module fixtures start once): the suite's live
# tests mostly wait on servers they start, so two overlap well on 2 cores (about 13 minutes here
# against 20-22 in one process). ZGTOOL_TEST_WORKERS=0 runs it in one process, as before.
.venv/bin/python -m pytest -q -n "${ZGTOOL_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
set -e
[ $lint_rc -ne 0 ] && echo "test: lint (ruff/mypy) failed" >&2
# pytest's 5 means "no tests collected": a failure for us, not a pass
[ $rc -ne 0 ] && exit $rc
exit $lint_rc
