#!/usr/bin/env bash
# Lint every shell script of the repository with ShellCheck (`make lint`): *.sh files and files
# whose first line names sh/bash/dash. Settings (follow sourced files) are in .shellcheckrc. A check
# may be disabled on one line only, with a comment saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
is_script() {
  local first=
  [[ $1 == *.sh ]] && return 0
  IFS= read -r first < "$1" 2>/dev/null || true
  [[ $first =~ ^\#!.*[/\ ](ba|da)?sh([[:space:]]|$) ]]
}
files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  list=$(git ls-files --cached --others --exclude-standard)
else
  list=$(find . -path ./target -prune -o -path ./.git -prune -o -type f -print | sed 's|^\./||')
fi
while IFS= read -r f; do
  if [[ -f $f ]] && is_script "$f"; then files+=("$f"); fi
done <<< "$list"
echo "shellcheck: ${#files[@]} scripts"
shellcheck -x "${files[@]}"
