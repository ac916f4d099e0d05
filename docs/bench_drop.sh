#!/usr/bin/env bash
# A drop's crowd (issue 36), open loop over HTTP, before and after:
#   BEFORE=/path/to/checkout-before bash docs/bench_drop.sh        both trees, one after the other
#   bash docs/bench_drop.sh                                         this tree only
#   ROUNDS=2 SERVER_CPUS= CLIENT_CPUS= bash docs/bench_drop.sh      twice each, nothing pinned
# For each tree in turn (one server at a time): its gunicorn as its image runs it (gunicorn -c
# config/gunicorn.conf.py -w 4 --threads 16), DEBUG off, rate limits and the unpaid-orders limit off, on
# the database shop_bench; then this tree's load generator, ROUNDS times:
#   manage.py loadtest --url URL --profile drop        300 units, 3,000 people + 500 scripts in the
#                                                       first second; C measured first (closed loop)
#   ... --profile drop --capacity C --load 4            the crowd at 4x C, then at 10x C
#   ... --profile drop --capacity C --prequeue-seconds 10   the issue's crowd arriving in 10 s before
#                                                       the opening, in the product's pre-queue,
#                                                       shuffled at the opening, then kept in
#                                                       arrival order (--prequeue-order fifo)
# Pinning as docs/bench_crowd.sh: the server, MariaDB and Redis on SERVER_CPUS, the generator on
# CLIENT_CPUS (PIN_SHARED=no: MariaDB and Redis are left alone, for a machine others use too).
# JSON in OUT (default /tmp/bench-drop).
set -euo pipefail
cd "$(dirname "$0")/.."
. docs/bench_trees.sh
AFTER=$(pwd)
BEFORE=${BEFORE:-}
ROUNDS=${ROUNDS:-1} WORKERS=${WORKERS:-4} THREADS=${THREADS:-16} OUT=${OUT:-/tmp/bench-drop}
SERVER_CPUS=${SERVER_CPUS-0} CLIENT_CPUS=${CLIENT_CPUS-1} PIN_SHARED=${PIN_SHARED:-yes} PORT=${PORT:-8076}
export RATELIMIT_ENABLE=false SHOP_MAX_UNPAID_ORDERS=off PYTHONWARNINGS=ignore DEBUG=false DEV_ENV_FILE=
export SECRET_KEY=${SECRET_KEY:-bench} LOCKS_KEY_PREFIX=${LOCKS_KEY_PREFIX:-bench:}
export DATABASE_URL=${DATABASE_URL:-mysql://root@127.0.0.1:3306/shop_bench}
py=.venv/bin/python
mkdir -p "$OUT"
$py manage.py createdb >/dev/null && $py manage.py migrate --no-input -v 0
shared=$(pgrep -x mariadbd; pgrep -f 'redis-server .*:6379')
all_cpus=$(taskset -p $$ | awk '{print $NF}')
if [ -n "$SERVER_CPUS" ] && [ "$PIN_SHARED" = yes ]; then
  for pid in $shared; do taskset -a -p -c "$SERVER_CPUS" "$pid" >/dev/null; done
fi
server=
# At the end MariaDB and Redis get all the CPUs back (other work on this machine needs them).
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; for pid in $shared; do taskset -a -p "$all_cpus" "$pid" >/dev/null 2>&1; done; true' EXIT
# A run whose books fail says so and exits non-zero; the next runs go on.
load() { ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} $py manage.py loadtest --url "http://127.0.0.1:$PORT" --profile drop "$@" \
           || echo "=== the run above FAILED (exit $?)"; }
for side in before after; do
  if [ $side = before ]; then tree=$BEFORE; else tree=$AFTER; fi
  [ -n "$tree" ] || continue
  (cd "$tree" && exec ${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} .venv/bin/python -m gunicorn -c "$(gunicorn_conf_of .)" \
     -w "$WORKERS" --threads "$THREADS" -b "127.0.0.1:$PORT" --log-level warning "$(project_of .).wsgi") & server=$!
  for _ in $(seq 150); do curl -fs "http://127.0.0.1:$PORT/api/products/" >/dev/null 2>&1 && break; sleep 0.1; done
  for round in $(seq "$ROUNDS"); do
    echo "=== $side #$round: $tree, gunicorn -w $WORKERS --threads $THREADS"
    load --json "$OUT/$side-$round-issue.json"
    capacity=$($py -c "import json; print(json.load(open('$OUT/$side-$round-issue.json'))['capacity'])")
    load --capacity "$capacity" --load 4 --json "$OUT/$side-$round-4x.json"
    load --capacity "$capacity" --load 10 --json "$OUT/$side-$round-10x.json"
    load --capacity "$capacity" --prequeue-seconds 10 --json "$OUT/$side-$round-prequeue.json"
    load --capacity "$capacity" --prequeue-seconds 10 --prequeue-order fifo --json "$OUT/$side-$round-prequeue-fifo.json"
  done
  kill "$server"; wait "$server" 2>/dev/null || true; server=
done
