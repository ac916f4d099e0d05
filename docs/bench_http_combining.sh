#!/usr/bin/env bash
# Combining off vs on over HTTP, side by side in one run: docs/bench_http_paths.sh with one tree and
# two settings (SHOP_COMBINING=false and true) on the hot product. DEBUG off, no rate limits, no
# unpaid-orders limit (load-test buyers never pay).
#   bash docs/bench_http_combining.sh            # 3 rounds of 8 s, 16 buyer processes
#   ROUNDS=1 DURATION=4 bash docs/bench_http_combining.sh
# gunicorn: WORKERS=4 x THREADS=4 (16 requests in flight). With sync workers only 4 requests are
# in the service at once, so a batch can never exceed 4 whatever the load.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=. BEFORE_ENV="SHOP_COMBINING=false" AFTER_ENV="SHOP_COMBINING=true" LABELS="off on" \
  SCENARIOS=${SCENARIOS:-hot} exec bash docs/bench_http_paths.sh
