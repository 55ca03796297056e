#!/usr/bin/env bash
# Set everything up (idempotent) and run the test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": a failure for us, not a pass
exit $rc
