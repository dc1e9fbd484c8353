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
# The optional plugins (mpi, nccl: built where Open MPI or NCCL is) have
# rows in the docs; a build without one does not print them, so its rows
# are left out of the comparison there.
generated=$("$zerod" check --schema)
absent=()
for optional in mpi nccl; do
  grep -q "^| \`$optional\` (" <<<"$generated" || absent+=("$optional")
done
drop_absent() {
  local line name
  while IFS= read -r line; do
    for name in "${absent[@]}"; do
      [[ $line == "| \`$name\` ("* ]] && continue 2
    done
    printf '%s\n' "$line"
  done
}
diff -u <(sed -n "/$begin/,/$end/p" "$doc" | sed '1d;$d' | drop_absent) <(printf '%s\n' "$generated") &&
  echo "docs.job_script_schema: the tables match zerod check --schema${absent[*]:+ (without ${absent[*]}: not in this build)}"
