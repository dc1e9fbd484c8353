#!/usr/bin/env bash
# docs/job-scripts.md's settings tables are what `zerod check --schema`
# prints (scripting/job_schema.cpp for the engine's keys, the shipped
# plugins' own specs for theirs): regenerate them there when this fails:
#   tests/docs_schema.sh ZEROD DOC --update
#   docs_schema.sh ZEROD DOC [--update]
set -euo pipefail
zerod=$1 doc=$2
begin='^<!-- generated: zerod check --schema'
end='^<!-- end of generated -->'
if [ "${3:-}" = --update ]; then
  tmp=$(mktemp)
  awk -v gen="$("$zerod" check --schema)" -v b="$begin" -v e="$end" '
    $0 ~ b {print; print gen; skip=1; next}
    $0 ~ e {skip=0}
    !skip {print}' "$doc" > "$tmp"
  cat "$tmp" > "$doc" && rm -f "$tmp"
  echo "docs_schema: $doc updated"
  exit 0
fi
diff -u <(sed -n "/$begin/,/$end/p" "$doc" | sed '1d;$d') <("$zerod" check --schema) &&
  echo "docs.job_script_schema: the tables match zerod check --schema"
