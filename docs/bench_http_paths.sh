#!/usr/bin/env bash
# Two checkouts over HTTP, side by side in one run (e.g. before and after a change to the checkout):
# a gunicorn server from each tree, on the same database and Redis, and `loadtest --url` against
# each in turn, ROUNDS times per scenario, alternating which goes first. DEBUG off.
#   BEFORE=/path/to/old/checkout bash docs/bench_http_paths.sh      # hot and spread, 3 rounds of 8 s
#   ROUNDS=2 DURATION=6 BEFORE=... bash docs/bench_http_paths.sh
#   BEFORE=. AFTER_ENV="SHOP_COMBINE_LANES=2" bash docs/bench_http_paths.sh   # one tree, two settings
#   SCENARIOS=hot LABELS="off on" ...           # one scenario; names for the two sides in the output
# (docs/bench_http_combining.sh is this script with combining off vs on.)
# gunicorn as the image runs it: WORKERS=4 x THREADS=4. The clients retry with Idempotency-Keys
# (loadtest --url does); the servers run without rate limits and without the unpaid-orders limit
# (load-test buyers never pay).
set -euo pipefail
cd "$(dirname "$0")/.."
. docs/bench_trees.sh
AFTER=$(pwd)
BEFORE=${BEFORE:?set BEFORE to the other checkout (with its own .venv or a link to one)}
SCENARIOS=${SCENARIOS:-hot spread} LABELS=${LABELS:-before after}
ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-8} PROCESSES=${PROCESSES:-16} WORKERS=${WORKERS:-4} THREADS=${THREADS:-4}
export RATELIMIT_ENABLE=false SHOP_MAX_UNPAID_ORDERS=off PYTHONWARNINGS=ignore DEBUG=false
export SECRET_KEY=${SECRET_KEY:-bench}
export DATABASE_URL=${DATABASE_URL:-mysql://root@127.0.0.1:3306/shop_bench}
py=.venv/bin/python
$py manage.py createdb >/dev/null && $py manage.py migrate --no-input -v 0
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
(cd "$BEFORE" && exec env ${BEFORE_ENV:-} .venv/bin/python -m gunicorn -c "$(gunicorn_conf_of .)" -w "$WORKERS" --threads "$THREADS" \
   -b 127.0.0.1:8071 --log-level warning "$(project_of .).wsgi") & pids+=($!)
(cd "$AFTER" && exec env ${AFTER_ENV:-} .venv/bin/python -m gunicorn -c "$(gunicorn_conf_of .)" -w "$WORKERS" --threads "$THREADS" \
   -b 127.0.0.1:8072 --log-level warning "$(project_of .).wsgi") & pids+=($!)
for port in 8071 8072; do
  up=
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/api/products/" >/dev/null 2>&1 && { up=1; break; }; sleep 0.1; done
  [ -n "$up" ] || { echo "gunicorn on :$port did not start" >&2; exit 1; }
done
read -r first second <<<"$LABELS"
declare -A label=([8071]=$first [8072]=$second)
declare -A products=([hot]=1 [spread]=8)
for scenario in $SCENARIOS; do
  for r in $(seq "$ROUNDS"); do
    order=(8071 8072); [ $((r % 2)) = 0 ] && order=(8072 8071)
    for port in "${order[@]}"; do
      out=$($py manage.py loadtest --url "http://127.0.0.1:$port" --products "${products[$scenario]}" --stock 1000000 \
            --duration "$DURATION" --processes "$PROCESSES" --no-progress \
            --json "/tmp/http-paths-$scenario-${label[$port]}-$r.json")
      echo "$scenario round $r ${label[$port]}: $(echo "$out" | grep -E '^(http|main) ' | head -1)"
    done
  done
done
$py - "$ROUNDS" "$SCENARIOS" "$first" "$second" <<'PY'
import json, statistics, sys
rounds, scenarios, before, after = int(sys.argv[1]), sys.argv[2].split(), sys.argv[3], sys.argv[4]
def fig(scenario, side, key):
    vals = []
    for r in range(1, rounds + 1):
        s = json.load(open(f"/tmp/http-paths-{scenario}-{side}-{r}.json"))["phases"][-1]
        vals.append(s["orders_per_s"] if key == "orders" else s["latency_ms"][key])
    return statistics.median(vals)
for scenario in scenarios:
    for key in ("orders", "p50", "p99", "max"):
        b, a = fig(scenario, before, key), fig(scenario, after, key)
        print(f"{scenario:>6} {key:>6}: {before} {b:9,.1f}  {after} {a:9,.1f}  {after}/{before} {a / b:.2f}x")
PY
