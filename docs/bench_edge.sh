#!/usr/bin/env bash
# The worker's edge, before and after, side by side in one run: what a `busy` answer costs, and
# the app's whole request path (a JSON 404) beside it.
#   BEFORE=/path/to/checkout-before bash docs/bench_edge.sh
#   RATE=2000 SECONDS_EACH=5 ROUNDS=3 BEFORE=... bash docs/bench_edge.sh
# A gunicorn server from each tree, one worker of THREADS threads (gunicorn -c config/gunicorn.conf.py),
# DEBUG off, SHOP_MAX_WAITING=1: a buyer kept waiting in a product's line (its lock held by this
# script, the buyer sending its order again as soon as it is answered lock_timeout) fills the
# worker's lines, so its main loop answers more orders of that product 503 `busy` before the app
# (config/gunicorn_worker.py). Then, ROUNDS times, alternating which goes first, such orders are
# sent open loop (RATE a second for SECONDS_EACH s, a new connection each, latency from the
# schedule) to each server in turn, and the worker's CPU (utime + stime, /proc) is read before
# and after: CPU per answer, busy answers (the worker's own, `"where":"server"`) and p50/p99, side
# by side. The same with GETs of a JSON 404 (the app's whole request path, no checkout):
# PATHS="busy notfound" (default both). PAIRED=1: both servers at once instead (see there): the
# figure to trust on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. docs/bench_trees.sh
AFTER=$(pwd)
BEFORE=${BEFORE:?set BEFORE to the checkout before (with its own .venv or a link to one)}
RATE=${RATE:-2000} SECONDS_EACH=${SECONDS_EACH:-5} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-16}
export RATELIMIT_ENABLE=false SHOP_MAX_UNPAID_ORDERS=off PYTHONWARNINGS=ignore DEBUG=false DEV_ENV_FILE=
export SECRET_KEY=${SECRET_KEY:-bench} LOCKS_KEY_PREFIX=bench:
export DATABASE_URL=${DATABASE_URL:-mysql://root@127.0.0.1:3306/shop_bench}
py=.venv/bin/python
out=$(mktemp -d)
$py manage.py createdb >/dev/null && $py manage.py migrate --no-input -v 0
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$out"' EXIT
for side in before after; do
  if [ $side = before ]; then tree=$BEFORE port=8081; else tree=$AFTER port=8082; fi
  (cd "$tree" && SHOP_MAX_WAITING=1 exec .venv/bin/python -m gunicorn -c "$(gunicorn_conf_of .)" -w 1 \
     --threads "$THREADS" -b 127.0.0.1:$port --log-level warning "$(project_of .).wsgi") & pids+=($!)
done
for port in 8081 8082; do
  up=
  for _ in $(seq 150); do curl -fs "http://127.0.0.1:$port/api/products/" >/dev/null 2>&1 && { up=1; break; }; sleep 0.1; done
  [ -n "$up" ] || { echo "gunicorn on :$port did not start" >&2; exit 1; }
done
declare -A master=([8081]=${pids[0]} [8082]=${pids[1]}) label=([8081]=before [8082]=after)

# The waiting buyer of each server: a product whose lock this script holds, and one buyer who
# orders it again and again (each waits its 3 s in line, then lock_timeout), so the lines are full.
HELD=$out/held.json DJANGO_SETTINGS_MODULE=$(project_of .).settings $py - > "$out/waiter.log" 2>&1 <<'PY' & pids+=($!)
import threading, time, urllib.request, django, json
django.setup()
from locks import Lock
from django.contrib.auth import get_user_model
from shop.plumbing.lock_names import product_lock
from shop.models import ApiToken, Product
user, _ = get_user_model().objects.get_or_create(username="edge-bench-waiter")
token = ApiToken.issue(user_id=user.pk, name="edge bench")
product, _ = Product.objects.get_or_create(sku="EDGE-BENCH-HELD", defaults={"name": "Held", "price": "1.00", "stock": 10})
body = json.dumps({"lines": [{"product_id": product.pk, "quantity": 1}]}).encode()
json.dump({"token": token, "body": body.decode()}, open(__import__("os").environ["HELD"], "w"))
def wait_in_line(port):
    while True:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/orders/", data=body, method="POST", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=30).read()
        except Exception:
            pass
with Lock(product_lock(product.pk), ttl=3600):
    for port in (8081, 8082):
        threading.Thread(target=wait_in_line, args=(port,), daemon=True).start()
    time.sleep(3600)
PY
sleep 3

# CPU ticks (utime + stime) of a gunicorn master's workers.
ticks() { local sum=0 pid; for pid in $(pgrep -P "$1"); do
  sum=$((sum + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0))); done; echo $sum; }

if [ "${PAIRED:-}" = 1 ]; then
  # Both servers at once, RATE/2 a second each, the requests alternating between them: whatever
  # else runs on a shared machine falls on both alike (on a busy 2-core machine an A/A run of one
  # tree gave 1.01, where the rounds above, one server after the other, vary by 10-20%).
  for path in ${PATHS:-busy notfound}; do
    for r in $(seq "$ROUNDS"); do
      b0=$(ticks "${master[8081]}") a0=$(ticks "${master[8082]}")
      $py - "$RATE" "$SECONDS_EACH" "$out/paired-$path-$r.json" "$path" "$out/held.json" <<'PY'
import asyncio, json, sys, time
rate, seconds, path, kind = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
held = json.load(open(sys.argv[5]))
if kind == "busy":
    body = held["body"].encode()
    head = (f"POST /api/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {held['token']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    request = head.encode() + body
else:
    request = b"GET /api/no-such-thing/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
seen = {port: {"answered": 0, "busy": 0, "lat": []} for port in (8081, 8082)}
async def one(at, port):
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        w.write(request)
        data = await asyncio.wait_for(r.read(), 10)
        w.close()
        seen[port]["answered"] += data[9:12].isdigit()
        seen[port]["busy"] += b'"where":"server"' in data
    except Exception:
        pass
    seen[port]["lat"].append(time.monotonic() - at)
async def main():
    t0 = time.monotonic() + 0.2
    await asyncio.gather(*(one(t0 + i / rate, 8081 + i % 2) for i in range(int(rate * seconds))))
asyncio.run(main())
for stats in seen.values():
    stats["lat"].sort()
    stats["p50"], stats["p99"] = stats["lat"][len(stats["lat"]) // 2], stats["lat"][int(len(stats["lat"]) * 0.99)]
    del stats["lat"]
json.dump(seen, open(path, "w"))
PY
      echo "$path $r $(( $(ticks "${master[8081]}") - b0 )) $(( $(ticks "${master[8082]}") - a0 ))" >> "$out/paired"
    done
  done
  $py - "$out" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
from pathlib import Path
out, hz = Path(sys.argv[1]), int(sys.argv[2])
rows = {}
for line in (out / "paired").read_text().split("\n"):
    if line:
        path, r, before, after = line.split()
        seen = json.loads((out / f"paired-{path}-{r}.json").read_text())
        rows.setdefault(path, []).append((int(before), int(after), seen["8081"], seen["8082"]))
print(f"{'path':<9} {'round':>5} {'before us/answer':>17} {'after':>7} {'after/before':>12} {'answered':>17} {'busy':>13}")
for path, runs in rows.items():
    for r, (before, after, b, a) in enumerate(runs, 1):
        cb, ca = before / hz * 1e6 / max(b["answered"], 1), after / hz * 1e6 / max(a["answered"], 1)
        print(f"{path:<9} {r:>5} {cb:>17.0f} {ca:>7.0f} {ca / cb:>12.2f} {b['answered']:>8} {a['answered']:>8}"
              f" {b['busy']:>6} {a['busy']:>6}")
    cb = sum(x[0] for x in runs) / hz * 1e6 / max(sum(x[2]["answered"] for x in runs), 1)
    ca = sum(x[1] for x in runs) / hz * 1e6 / max(sum(x[3]["answered"] for x in runs), 1)
    ratios = [(x[1] / max(x[3]["answered"], 1)) / (x[0] / max(x[2]["answered"], 1)) for x in runs if x[0]]
    print(f"{path}: CPU per answer, all rounds: before {cb:.0f} us, after {ca:.0f} us, after / before = {ca / cb:.2f}"
          f" (rounds: median {statistics.median(ratios):.2f}, {min(ratios):.2f} .. {max(ratios):.2f})")
PY
  exit 0
fi

for path in ${PATHS:-busy notfound}; do
  for r in $(seq "$ROUNDS"); do
    order=(8081 8082); [ $((r % 2)) = 0 ] && order=(8082 8081)
    for port in "${order[@]}"; do
      before_ticks=$(ticks "${master[$port]}")
      $py - "$port" "$RATE" "$SECONDS_EACH" "$out/$path-${label[$port]}-$r.json" "$path" "$out/held.json" <<'PY'
import asyncio, json, sys, time
port, rate, seconds, path, kind = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
held = json.load(open(sys.argv[6]))
if kind == "busy":  # an order of the product whose buyer waits in line: the worker answers it busy
    body = held["body"].encode()
    head = (f"POST /api/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {held['token']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    request = head.encode() + body
else:  # the app's whole request path, no checkout
    request = b"GET /api/no-such-thing/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
lat, statuses, busy = [], {}, 0
async def one(at):
    global busy
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        w.write(request)
        data = await asyncio.wait_for(r.read(), 10)
        w.close()
        status = data.split(b" ", 2)[1].decode() if data else "none"
        busy += b'"where":"server"' in data
    except Exception:
        status = "error"
    statuses[status] = statuses.get(status, 0) + 1
    lat.append(time.monotonic() - at)
async def main():
    t0 = time.monotonic() + 0.2
    await asyncio.gather(*(one(t0 + i / rate) for i in range(int(rate * seconds))))
asyncio.run(main())
lat.sort()
json.dump({"sent": len(lat), "statuses": statuses, "busy": busy, "p50": lat[len(lat) // 2],
           "p99": lat[int(len(lat) * 0.99)]}, open(path, "w"))
PY
      echo "$path ${label[$port]} $r $(( $(ticks "${master[$port]}") - before_ticks ))" >> "$out/ticks"
    done
  done
done

$py - "$out" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
from pathlib import Path
out, hz = Path(sys.argv[1]), int(sys.argv[2])
rows = {}
for line in (out / "ticks").read_text().split("\n"):
    if not line:
        continue
    path, side, r, ticks = line.split()
    data = json.loads((out / f"{path}-{side}-{r}.json").read_text())
    answered = sum(n for status, n in data["statuses"].items() if status.isdigit())
    busy, p50, p99 = data["busy"], data["p50"], data["p99"]
    rows.setdefault((path, side), []).append((int(ticks) / hz * 1e6 / max(answered, 1), answered, busy, p50, p99))
print(f"{'path':<9} {'side':<7} {'CPU us/answer':>14} {'answered':>9} {'busy':>7} {'p50 ms':>8} {'p99 ms':>8}   (medians of rounds)")
for (path, side), runs in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] != "before")):
    med = [statistics.median(col) for col in zip(*runs, strict=True)]
    print(f"{path:<9} {side:<7} {med[0]:>14.0f} {med[1]:>9.0f} {med[2]:>7.0f} {med[3] * 1e3:>8.1f} {med[4] * 1e3:>8.1f}")
for path in sorted({p for p, _ in rows}):
    b, a = (statistics.median(r[0] for r in rows[(path, s)]) for s in ("before", "after"))
    print(f"{path}: CPU per answer after / before = {a / b:.2f}")
PY
