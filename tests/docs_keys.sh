#!/usr/bin/env bash
# docs/integrations.md's DeepSpeed key table is what `zerod translate --keys`
# prints (scripting/ds_keys.cpp is the one place it is written): regenerate
# it there when this fails.
#   docs_keys.sh ZEROD DOC
set -euo pipefail
zerod=$1 doc=$2
diff -u <(sed -n '/^<!-- generated: zerod translate --keys/,/^<!-- end of generated -->/p' "$doc" | sed '1d;$d') \
        <("$zerod" translate --keys) && echo "docs.deepspeed_keys: the table matches zerod translate --keys"
