#!/usr/bin/env bash
# Executes every notebook under notebooks/ headless, as CI does, and fails when a cell raises
# in any of them. The plots they save land in docs/images/; the executed copies go to a temporary
# folder, so the committed notebooks stay as they are unless --inplace is given.
#
#   scripts/run-notebooks.sh [--inplace] [NOTEBOOK.ipynb ...]
#
# RESULTS_GPU picks docs/results/<gpu>/ (default h100). Needs Jupyter, pandas and matplotlib:
# scripts/setup.sh --notebooks installs them.
set -euo pipefail

inplace=0
notebooks=()
for arg in "$@"; do
  case "$arg" in
    --inplace) inplace=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "run-notebooks.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    *) [ -f "$arg" ] || { echo "run-notebooks.sh: no notebook '$arg'" >&2; exit 2; }
       notebooks+=("$(cd "$(dirname "$arg")" && pwd)/$(basename "$arg")") ;;
  esac
done

cd "$(dirname "$0")/.."
if ! python3 -c 'import nbconvert, nbformat, ipykernel, matplotlib, pandas' 2>/dev/null; then
  echo "run-notebooks.sh: Jupyter (nbconvert, ipykernel), matplotlib or pandas is missing;" \
       "run: bash scripts/setup.sh --notebooks" >&2
  exit 1
fi
[ "${#notebooks[@]}" -gt 0 ] || notebooks=(notebooks/*.ipynb)
[ -f "${notebooks[0]}" ] || { echo "run-notebooks.sh: no notebooks under notebooks/" >&2; exit 1; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for notebook in "${notebooks[@]}"; do
  target=(--output-dir "$scratch")
  [ "$inplace" = 1 ] && target=(--inplace)
  echo "== $notebook"
  # nbconvert exits non-zero when a cell raises; the notebook's cwd is its own folder.
  if python3 -m nbconvert --to notebook --execute --ExecutePreprocessor.timeout=600 \
       "${target[@]}" "$notebook" > "$scratch/nbconvert.log" 2>&1; then
    echo "   executed"
  else
    echo "   FAILED; nbconvert said:"
    sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^/   /' "$scratch/nbconvert.log" | tail -n 40
    failed=1
  fi
done
if [ "$failed" -ne 0 ]; then
  echo "run-notebooks.sh: a notebook failed" >&2
  exit 1
fi
echo "run-notebooks.sh: ${#notebooks[@]} notebooks executed"
