#!/usr/bin/env bash
# The compile flags a step folder's step.cmake gives its kernel file, as add_step() passes them
# (CMakeLists.txt, attn_step_facts), for the scripts that compile a step by hand:
#
#   scripts/step-facts.sh STEP_FOLDER      e.g. steps/v8_warp_specialized
#
# prints, one per line: the architecture to build for (90a or 90) and the -D flags of the
# registration's facts (ATTN_STEP_MIN_CC, ATTN_STEP_MAX_CC, ATTN_STEP_FORWARD). Exit 1 when the
# folder has no step.cmake (a commit before it: the caller falls back to what that commit did).
set -euo pipefail
facts_file="${1:?give a step folder}/step.cmake"
[ -f "$facts_file" ] || exit 1
facts=$(grep -E '^attn_step_facts' "$facts_file")
arch=$(sed -nE 's/.*ARCH +([0-9]+a?).*/\1/p' <<< "$facts")
forward=$(sed -nE 's/.*FORWARD +(v[0-9]+).*/\1/p' <<< "$facts")
case "$arch" in
  90a) echo 90a; echo -DATTN_STEP_MIN_CC=90; echo -DATTN_STEP_MAX_CC=90 ;;
  75|80) echo 90; echo "-DATTN_STEP_MIN_CC=$arch"; echo -DATTN_STEP_MAX_CC=0 ;;
  *) echo "step-facts.sh: $facts_file: ARCH must be 75, 80 or 90a" >&2; exit 2 ;;
esac
echo "-DATTN_STEP_FORWARD=\"$forward\""
