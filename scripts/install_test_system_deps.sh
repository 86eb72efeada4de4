#!/usr/bin/env bash
# System packages the test suite needs beyond Python: headless Chromium for the report's browser test.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "note: chromium not installed and cannot apt-get install it: make test's browser tests will fail" \
       "(install chromium or set BROWSER_PATH; a plain pytest run skips them)" >&2
fi
