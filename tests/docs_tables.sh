#!/usr/bin/env bash
# Every Markdown table in the tree renders as one: a row that follows a blank
# line starts a table, so the next line must be its header separator
# (|---|...). A blank line inside a table ends it there, and the rows after
# it rendered as a paragraph of pipes (docs/job-scripts.md's optimizer table
# lost its three compressing optimizers that way).
#   docs_tables.sh ROOT
set -euo pipefail
root=$1
bad=0
while IFS= read -r f; do
  out=$(awk -v f="${f#"$root"/}" '
    /^[ \t]*```/ { fence = !fence }
    {
      if (want) {
        if ($0 !~ /^[ \t]*\|[ :|-]*-[ :|-]*$/)
          print f ":" start ": a table row after a blank line, with no header separator (|---|) under it: a blank line inside a table ends it"
        want = 0
      } else if (!fence && blank && $0 ~ /^[ \t]*\|/) {
        start = NR; want = 1
      }
      blank = ($0 ~ /^[ \t]*$/)
    }' "$f")
  if [ -n "$out" ]; then
    printf '%s\n' "$out"
    bad=1
  fi
done < <(find "$root" -mindepth 1 \( -name '.*' -o -name 'build*' -o -name venv -o -name target \) -prune -o -name '*.md' -print | sort)
[ "$bad" = 0 ] && echo "docs.tables: every table has its header"
