#!/usr/bin/env bash
# Set everything up (idempotent), lint (ruff + mypy over every package) and run the test suite.
# .ci/run calls exactly this. Either failing fails the command; the tests run even when lint fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
bash scripts/lint.sh
lint_rc=$?
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
[ $lint_rc -ne 0 ] && echo "test: lint (ruff/mypy) failed" >&2
# pytest's 5 means "no tests collected": a failure for us, not a pass
[ $rc -ne 0 ] && exit $rc
exit $lint_rc
