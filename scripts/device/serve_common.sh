#!/usr/bin/env bash
# Sourced by the device scripts that run `strata serve` from the packaged binaries.
# device_libs BIN: the library path for BIN's binaries (CUDA, the packaged cpp-httplib and
# brotli, cuBLASLt wherever the machine keeps it). start_server PORT LOG ARGS...: starts
# `BIN/strata serve --port PORT ARGS...` logging to LOG, sets $server to its pid and waits
# until /health answers (exit 1 with the log's tail if it does not come up).
device_libs() {
  local bin=$1
  export STRATA_SOURCE_DIR=$PWD
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
  [ -d "$bin/lib" ] && export LD_LIBRARY_PATH=$PWD/$bin/lib:$LD_LIBRARY_PATH
  if ldd "$bin/strata" | grep -q "not found"; then
    local extra
    extra=$(dirname "$(find / -name 'libcublasLt.so.13' 2>/dev/null | head -1)")
    export LD_LIBRARY_PATH=$extra:$LD_LIBRARY_PATH
  fi
}

healthy() {  # PORT
  if command -v curl >/dev/null; then curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1
  else python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null; fi
}

start_server() {  # PORT LOG ARGS...
  local port=$1 log=$2
  shift 2
  "$bin/strata" serve --port "$port" "$@" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 1 120); do
    healthy "$port" && break
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  if ! healthy "$port"; then
    echo "server did not come up"; tail -20 "$log"; kill $server 2>/dev/null; exit 1
  fi
}
