#!/usr/bin/env bash
# A crowd bigger than the server, open loop over HTTP, before and after, one run each:
#   BEFORE=/path/to/checkout-before bash docs/bench_crowd.sh
#   PHASE=8 BEFORE_THREADS=4 AFTER_THREADS=16 SERVER_CPUS=0 CLIENT_CPUS=1 BEFORE=... bash docs/bench_crowd.sh
#   SIDES=after SHOP_HEAD_SLOTS_PER_CLIENT=64 bash docs/bench_crowd.sh   this tree only, with a setting
# For each tree in turn (one server at a time): its gunicorn as its image runs it (gunicorn -c
# config/gunicorn.conf.py -w 4, the tree's thread count), DEBUG off, rate limits and the unpaid-orders
# limit off, on the database shop_bench (the tree before: shop_bench_before); then the tree's own open-loop load generator:
#   manage.py loadtest --url URL --profile spike     capacity C (closed loop, 32 buyers), then
#                                                     0.5x 1x 2x 4x 10x 0.5x C, PHASE s each
#   manage.py loadtest --url URL --profile flash --capacity C    1,000 units at 4x C, then at 10x C
# The server, MariaDB and Redis run on SERVER_CPUS and the generator on CLIENT_CPUS (taskset), so
# the generator's own CPU (docs/benchmarks.md) is not taken from the server it measures; on a
# 2-core machine that leaves the server one core. SERVER_CPUS= CLIENT_CPUS= (empty) pins nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. docs/bench_trees.sh
AFTER=$(pwd)
SIDES=${SIDES:-before after}  # SIDES=after: this tree only (e.g. to compare its settings run by run)
case " $SIDES " in *" before "*) BEFORE=${BEFORE:?set BEFORE to the checkout before (with its own .venv or a link to one)};;
  *) BEFORE=${BEFORE:-$AFTER};; esac
PHASE=${PHASE:-8} WORKERS=${WORKERS:-4} BEFORE_THREADS=${BEFORE_THREADS:-4} AFTER_THREADS=${AFTER_THREADS:-16}
SERVER_CPUS=${SERVER_CPUS-0} CLIENT_CPUS=${CLIENT_CPUS-1}
export RATELIMIT_ENABLE=false SHOP_MAX_UNPAID_ORDERS=off PYTHONWARNINGS=ignore DEBUG=false DEV_ENV_FILE=
export SECRET_KEY=${SECRET_KEY:-bench} LOCKS_KEY_PREFIX=bench:
export DATABASE_URL=${DATABASE_URL:-mysql://root@127.0.0.1:3306/shop_bench}
# The tree before runs on a database of its own, at its own migrations, with its own load
# generator (a database migrated by the newer tree has columns the older code does not fill).
BEFORE_DATABASE_URL=${BEFORE_DATABASE_URL:-${DATABASE_URL}_before}
py=.venv/bin/python
$py manage.py createdb >/dev/null && $py manage.py migrate --no-input -v 0
case " $SIDES " in *" before "*)
  (cd "$BEFORE" && DATABASE_URL=$BEFORE_DATABASE_URL .venv/bin/python manage.py createdb >/dev/null \
     && DATABASE_URL=$BEFORE_DATABASE_URL .venv/bin/python manage.py migrate --no-input -v 0);; esac
shared=$(pgrep -x mariadbd; pgrep -f 'redis-server .*:6379')
all_cpus=$(taskset -p $$ | awk '{print $NF}')
if [ -n "$SERVER_CPUS" ]; then
  for pid in $shared; do taskset -a -p -c "$SERVER_CPUS" "$pid" >/dev/null; done
fi
server=
# At the end MariaDB and Redis get all the CPUs back (other work on this machine needs them).
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; for pid in $shared; do taskset -a -p "$all_cpus" "$pid" >/dev/null 2>&1; done; true' EXIT
for side in $SIDES; do
  if [ $side = before ]; then tree=$BEFORE threads=$BEFORE_THREADS db=$BEFORE_DATABASE_URL
  else tree=$AFTER threads=$AFTER_THREADS db=$DATABASE_URL; fi
  gen="$tree/.venv/bin/python $tree/manage.py"
  (cd "$tree" && DATABASE_URL=$db exec ${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} .venv/bin/python -m gunicorn -c "$(gunicorn_conf_of .)" \
     -w "$WORKERS" --threads "$threads" -b 127.0.0.1:8075 --log-level warning "$(project_of .).wsgi") & server=$!
  for _ in $(seq 150); do curl -fs http://127.0.0.1:8075/api/products/ >/dev/null 2>&1 && break; sleep 0.1; done
  echo "=== $side: $tree, gunicorn -w $WORKERS --threads $threads"
  DATABASE_URL=$db ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} $gen loadtest --url http://127.0.0.1:8075 --profile spike \
    --phase-seconds "$PHASE" --json "/tmp/crowd-spike-$side.json"
  capacity=$($py -c "import json; print(json.load(open('/tmp/crowd-spike-$side.json'))['capacity'])")
  DATABASE_URL=$db ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} $gen loadtest --url http://127.0.0.1:8075 --profile flash \
    --capacity "$capacity" --phase-seconds "$PHASE" --json "/tmp/crowd-flash-$side.json"
  kill "$server"; wait "$server" 2>/dev/null || true; server=
done
