#!/usr/bin/env bash
# strata serve (plain and --supervise): SIGTERM sent the moment "listening on" is printed, when
# the listener may not be running yet, still ends the process promptly with status 0.
# Usage: serve_sigterm.sh <strata-binary> <tests/data dir>
set -u
BIN="$1"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# term_at_listen <name> <flags...>: starts the server, sends SIGTERM as soon as it prints its
# listening line, and expects it to exit 0 within 30 s.
term_at_listen() {
  local name="$1"; shift
  "$BIN" serve --port 0 --threads 1 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  local pid=$!
  local i
  for i in $(seq 1 6000); do
    grep -q "listening on" "$TMP/$name.out" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
  done
  if ! grep -q "listening on" "$TMP/$name.out"; then
    fail "$name: never printed its listening line: $(tail -3 "$TMP/$name.err")"
    kill -9 $pid 2>/dev/null
    return
  fi
  kill -TERM $pid
  for i in $(seq 1 300); do
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 $pid 2>/dev/null; then
    fail "$name: still running 30 s after SIGTERM"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    return
  fi
  wait $pid
  local rc=$?
  [ $rc -eq 0 ] || fail "$name: exit status $rc after SIGTERM: $(tail -3 "$TMP/$name.err")"
}

for round in 1 2 3; do
  term_at_listen "plain-$round"
done
term_at_listen "supervised" --supervise

[ $failures -eq 0 ] || exit 1
echo "serve_sigterm: all passed"
