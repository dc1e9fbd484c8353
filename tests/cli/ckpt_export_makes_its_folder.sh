#!/usr/bin/env bash
# `zerod ckpt export --to DIR/m.safetensors` makes DIR when it is not there,
# as `zerod ckpt reshard` makes its --to (it failed, naming the file it could
# not create), and an export that refuses leaves no folder it made: a --to in
# the checkpoint's own directory, spelled through a folder that is not there
# ("ck/new/../m.safetensors"), is refused with "new" removed again.
#   ckpt_export_makes_its_folder.sh ZEROD RESUME_TRAINER SCRATCH_DIR
set -u
zerod=$1 trainer=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

# A checkpoint: the snapshot a 2-step job takes at its clean end.
cat >"$work/job.lua" <<'LUA'
return {
  optimizer = { type = "adamw", lr = 0.05 },
  snapshot = { path = "ck", every = 0 },
}
LUA
"$zerod" run --nproc 1 --job "$work/job.lua" -- "$trainer" 2 0 >"$work/run.log" 2>&1 ||
  fail "the run that writes the checkpoint failed: $(tail -5 "$work/run.log")"
ck=$(ls -d "$work"/ck/step-* 2>/dev/null | head -1)
[ -n "$ck" ] || fail "no snapshot under $work/ck: $(tail -5 "$work/run.log")"

out=$("$zerod" ckpt export "$ck" --to "$work/out/a/m.safetensors" 2>&1) ||
  fail "export into a folder that is not there: $out"
[ -s "$work/out/a/m.safetensors" ] || fail "no $work/out/a/m.safetensors after: $out"
echo "ok: exported into $work/out/a, which it made"

out=$("$zerod" ckpt export "$ck" --to "$ck/new/../m.safetensors" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "an export into the checkpoint's own directory exited $rc: $out"
grep -q "is in the checkpoint's own directory" <<<"$out" || fail "refused, but not for its directory: $out"
[ ! -e "$ck/new" ] || fail "the refused export left $ck/new behind"
[ ! -e "$ck/m.safetensors" ] || fail "the refused export wrote $ck/m.safetensors"
echo "ok: the refused export left nothing"
rm -rf "$work"
echo "ckpt export: ok"
