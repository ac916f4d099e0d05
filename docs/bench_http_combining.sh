#!/usr/bin/env bash
# Combining on vs off over HTTP, side by side in one run: two gunicorn servers on the same
# database and Redis (one with SHOP_COMBINING=true, one with false), and `loadtest --url`
# against each in turn, ROUNDS times, alternating which goes first. DEBUG off.
#   bash docs/bench_http_combining.sh            # 3 rounds of 8 s, 16 buyer processes
#   ROUNDS=1 DURATION=4 bash docs/bench_http_combining.sh
# gunicorn: WORKERS=4 x THREADS=4 (16 requests in flight). With sync workers only 4 requests are
# in the service at once, so a batch can never exceed 4 whatever the load.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-8} PROCESSES=${PROCESSES:-16} WORKERS=${WORKERS:-4} THREADS=${THREADS:-4}
export RATELIMIT_ENABLE=false PYTHONWARNINGS=ignore DEBUG=false SECRET_KEY=${SECRET_KEY:-bench} DJANGO_SETTINGS_MODULE=shop.settings
export DATABASE_URL=${DATABASE_URL:-mysql://root@127.0.0.1:3306/shop_bench}
py=.venv/bin/python
$py manage.py createdb >/dev/null && $py manage.py migrate --no-input -v 0
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
SHOP_COMBINING=true $py -m gunicorn -c gunicorn.conf.py -w "$WORKERS" --threads "$THREADS" -b 127.0.0.1:8061 --log-level warning shop.wsgi & pids+=($!)
SHOP_COMBINING=false $py -m gunicorn -c gunicorn.conf.py -w "$WORKERS" --threads "$THREADS" -b 127.0.0.1:8062 --log-level warning shop.wsgi & pids+=($!)
for port in 8061 8062; do
  up=
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/api/products/" >/dev/null 2>&1 && { up=1; break; }; sleep 0.1; done
  [ -n "$up" ] || { echo "gunicorn on :$port did not start" >&2; exit 1; }
done
declare -A label=([8061]=on [8062]=off)
for r in $(seq "$ROUNDS"); do
  order=(8061 8062); [ $((r % 2)) = 0 ] && order=(8062 8061)
  for port in "${order[@]}"; do
    out=$($py manage.py loadtest --url "http://127.0.0.1:$port" --stock 1000000 --duration "$DURATION" \
          --processes "$PROCESSES" --no-progress --json "/tmp/http-combining-${label[$port]}-$r.json")
    echo "round $r combining ${label[$port]}: $(echo "$out" | grep -E '^(http|main) ' | head -1)"
  done
done
$py - "$ROUNDS" <<'PY'
import json, statistics, sys
rounds = int(sys.argv[1])
def fig(side, key):
    vals = []
    for r in range(1, rounds + 1):
        data = json.load(open(f"/tmp/http-combining-{side}-{r}.json"))
        s = data["phases"][-1]
        vals.append(s["orders_per_s"] if key == "orders" else s["latency_ms"][key])
    return statistics.median(vals), vals
for key in ("orders", "p50", "p99", "max"):
    on, on_all = fig("on", key)
    off, off_all = fig("off", key)
    ratio = f"{on / off:.2f}x" if off else "-"
    print(f"{key:>6}: combining on {on:9,.1f} {on_all}  off {off:9,.1f} {off_all}  ratio {ratio}")
PY
