#!/usr/bin/env bash
# Installs what strata builds and tests with, from Debian's packages (Debian 12).
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  g++ cmake ninja-build pkg-config xz-utils \
  nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev libutf8proc-dev libspdlog-dev libfmt-dev \
  libcli11-dev libxxhash-dev libzstd-dev liburing-dev libopenblas-dev libhiredis-dev redis-server \
  libgtest-dev libgmock-dev libbenchmark-dev json-schema-test-suite python3-numpy python3-jsonschema >/dev/null
# Node.js runs the end-to-end suite's openai client. Keep a Node.js that is already installed
# (a newer one from another source conflicts with Debian's npm package).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
# Headless Chromium runs the browser test of the page at / (tests/e2e/status_page.test.mjs).
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
