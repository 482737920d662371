#!/usr/bin/env bash
# Builds the documentation site with warnings as errors (a broken link, a missing page in the
# navigation or a docstring that cannot be rendered fails the build).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 COLUMNS=100 .venv/bin/mkdocs build --strict --site-dir "$site"
