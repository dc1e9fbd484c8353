# Sourced by the daemon's shell tests: within CMD SECONDS waits up to
# SECONDS for CMD (evaluated) to succeed, polling every 50 ms; status 1 when
# it never did. Polling, not a fixed sleep, so the tests keep their pace on
# a loaded 2-core CI machine and end early on a fast one.
within() {
  local i=0
  while ! eval "$1"; do
    i=$((i + 1))
    [ "$i" -gt $(($2 * 20)) ] && return 1
    sleep 0.05
  done
}
