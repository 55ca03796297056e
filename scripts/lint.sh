#!/usr/bin/env bash
# ruff over every Python folder, mypy over every package zgtool installs (zgtool, zgtool.engine,
# zgtool.probes, zgtool.k6). engine/, probes/ and k6/ install under the zgtool namespace through
# pyproject's package-dir mapping, which mypy cannot follow from the checkout (it would see
# `zgtool.engine` as missing and, with ignore_missing_imports, silently as Any). So mypy runs over a
# tree of symlinks laid out the way the installed package is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
$PY -m ruff check zgtool engine probes k6 tests bench scripts
tree=.venv/mypy-tree
rm -rf "$tree" && mkdir -p "$tree/zgtool"
for e in zgtool/*; do ln -s "$PWD/$e" "$tree/zgtool/"; done
for p in engine probes k6; do ln -s "$PWD/$p" "$tree/zgtool/$p"; done
(cd "$tree" && "$OLDPWD/$PY" -m mypy --config-file "$OLDPWD/pyproject.toml" \
  --cache-dir "$OLDPWD/.mypy_cache" -p zgtool)
