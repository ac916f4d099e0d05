#!/usr/bin/env bash
# One entry point for a fresh machine:
#   ./dev.sh run    set everything up (services, venv, database, migrations, demo data), then serve
#                   on 127.0.0.1:$PORT (default 8000) with the jobs runner beside the server
#   ./dev.sh test   set everything up the same way, then run the whole test suite
#   ./dev.sh fast   the fast tier only (pytest -m fast): the venv, no MariaDB, Redis or ZooKeeper
#   ./dev.sh check  the checks: ruff check and mypy (the venv only)
#   ./dev.sh setup  only the set-up part
#   ./dev.sh where  say which database and Redis db this checkout uses (writes .env.dev if missing)
# Idempotent: safe to run again and again. Each checkout gets its own database and Redis db
# (derived from its path, written once into .env.dev): two checkouts never share data.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-config.settings}
# A development machine: DEBUG on (settings default to off) and, with it, Django's dev-only key.
# The test suite uses tests.settings (pyproject.toml), which brings its own throwaway key.
export DEBUG=${DEBUG:-true}
# What other shells get: settings read this file when present (environment variables win), so the
# README's `.venv/bin/python manage.py ...` works from any shell after `./dev.sh run`.
dev_env_file=.env.dev

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=
apt_install() {
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# `fast`: only what the venv needs to build (mysqlclient's headers, a compiler), no servers.
ensure_packages() {
  local want=()
  if [ "${1:-}" != fast ]; then
    [ -x /usr/sbin/mariadbd ] || command -v mysqld >/dev/null 2>&1 || want+=(mariadb-server)
    command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
  fi
  pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mysqlclient 2>/dev/null \
    || want+=(libmariadb-dev pkg-config)
  command -v gcc >/dev/null 2>&1 || want+=(gcc)
  if [ "${1:-}" = test ]; then
    command -v chromium >/dev/null 2>&1 || want+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || want+=(chromium-driver)
  fi
  if [ ${#want[@]} -gt 0 ]; then say "installing ${want[*]}"; apt_install "${want[@]}"; fi
}

mysql_ok() { "$VENV/bin/python" - <<'PY' 2>/dev/null
import MySQLdb
MySQLdb.connect(host="127.0.0.1", port=3306, user="root", passwd="", connect_timeout=2).close()
PY
}

ensure_mariadb() {
  if mysqladmin --protocol=tcp -h127.0.0.1 -uroot ping >/dev/null 2>&1; then :; else
    say "starting MariaDB"
    as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    for _ in $(seq 60); do
      mysqladmin --protocol=tcp -h127.0.0.1 -uroot ping >/dev/null 2>&1 && break
      mysqladmin -uroot ping >/dev/null 2>&1 && break
      sleep 0.5
    done
  fi
  # A fresh Debian MariaDB lets root in only through the socket: allow the empty TCP password too.
  if ! mysql --protocol=tcp -h127.0.0.1 -uroot -e 'SELECT 1' >/dev/null 2>&1; then
    say "allowing root@127.0.0.1 with an empty password (local development server)"
    as_root mysql -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD(''); FLUSH PRIVILEGES;"
  fi
}

ensure_redis() {
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    say "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    for _ in $(seq 40); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.25; done
  fi
}

# This checkout's own database and Redis db, from its path: "shop_<folder>_<6 hex of the path>"
# and a db from 1 to 15 (0 is what a checkout without .env.dev entries shares with others).
checkout_hash() { printf %s "$(pwd -P)" | sha1sum | cut -c1-6; }
checkout_database() {
  local folder
  folder=$(basename "$(pwd -P)")
  folder=$(printf %s "$folder" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9' '_' | cut -c1-20)
  echo "shop_${folder}_$(checkout_hash)"
}
checkout_redis_db() { echo $(( 1 + 0x$(checkout_hash) % 15 )); }

# DEBUG on, a SECRET_KEY generated once for this checkout (kept: sessions survive a re-run), and
# this checkout's database and Redis db (a file written before they existed is left as it is).
ensure_dev_env_file() {
  [ -f "$dev_env_file" ] && return
  say "writing $dev_env_file (DEBUG=true, a generated SECRET_KEY, this checkout's database and Redis db)"
  local key
  key=$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(50))')
  (umask 077; cat > "$dev_env_file" <<EOF
# Written by ./dev.sh for this development checkout (git- and docker-ignored); never on a server.
# config/settings/environment.py reads it when present, after .env; exported environment variables win.
DEBUG=true
SECRET_KEY=$key
# This checkout's own data (derived from its path), so two checkouts on one machine never share it.
DATABASE_URL=mysql://root@127.0.0.1:3306/$(checkout_database)
REDIS_URL=redis://127.0.0.1:6379/$(checkout_redis_db)
EOF
  )
}

# A setting as the settings read it: the environment, then .env, then .env.dev, then the default.
setting() {
  local name=$1 default=$2 file line
  if [ -n "${!name:-}" ]; then echo "${!name}"; return; fi
  for file in .env "$dev_env_file"; do
    [ -f "$file" ] || continue
    line=$(grep -E "^[[:space:]]*(export[[:space:]]+)?$name=" "$file" | tail -n 1) || continue
    line=${line#*=}; line=${line#[\"\']}; line=${line%[\"\']}
    echo "$line"
    return
  done
  echo "$default"
}

# Which database and Redis db this checkout uses; loudly when it is what every checkout shares.
say_where() {
  local db redis name
  db=$(setting DATABASE_URL mysql://root@127.0.0.1:3306/shop)
  redis=$(setting REDIS_URL redis://127.0.0.1:6379/0)
  name=${db##*/}; name=${name%%\?*}
  say "this checkout uses the database $name and Redis $(echo "$redis" | sed -E 's#//[^@/]*@#//#')"
  if [ "$name" = shop ] || [[ $redis =~ ^redis://[^/]*(/0)?$ ]]; then
    say "  the defaults, shared by every checkout on this machine that keeps them: for this one's own," \
      "put DATABASE_URL=mysql://root@127.0.0.1:3306/$(checkout_database) and" \
      "REDIS_URL=redis://127.0.0.1:6379/$(checkout_redis_db) in $dev_env_file"
  fi
}

# PORT must be a port number that 127.0.0.1 can listen on now: checked before any set-up, and
# again just before serving. The same bind as runserver's (SO_REUSEADDR, as socketserver does).
check_port() {
  local port=$1 why
  if ! [[ $port =~ ^[0-9]{1,5}$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    echo "PORT=$port is not a port number (1-65535); e.g. PORT=8001 ./dev.sh run" >&2
    exit 2
  fi
  if ! why=$("$PYTHON" - "$port" 2>&1 <<'PY'
import socket, sys
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", int(sys.argv[1])))
    except OSError as exc:
        sys.exit(exc.strerror)
PY
  ); then
    echo "port $port on 127.0.0.1 is not free ($why): stop what listens there (ss -ltnp 'sport = :$port')" \
      "or choose another port, e.g. PORT=$(( port < 65535 ? port + 1 : 8000 )) ./dev.sh run" >&2
    exit 1
  fi
}

# The dev server and the jobs runner (it expires unpaid orders, sends the mail outbox and finishes
# half-done refunds, as on a real server), stopped
# together: Ctrl-C, a SIGTERM to this script, or either of them exiting stops both.
serve_pids=()
stop_serving() {
  [ ${#serve_pids[@]} -gt 0 ] || return 0
  kill "${serve_pids[@]}" 2>/dev/null || true
  wait "${serve_pids[@]}" 2>/dev/null || true
  serve_pids=()
}
serve() {
  local port=$1 rc=0 ended
  trap stop_serving EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  "$VENV/bin/python" manage.py run_jobs & serve_pids+=($!)
  "$VENV/bin/python" manage.py runserver "127.0.0.1:$port" & serve_pids+=($!)
  wait -n -p ended "${serve_pids[@]}" || rc=$?
  # (On Ctrl-C run_jobs ends first: it stops on SIGINT, the server ignores it as a background job.)
  if [ "$ended" = "${serve_pids[0]}" ]; then say "run_jobs ended (status $rc): stopping the server too"
  else say "the server ended (status $rc): stopping run_jobs too"; fi
  exit "$rc"
}

configured_locks_backend() {
  "$VENV/bin/python" -c 'from django.conf import settings; print(settings.LOCKS["BACKEND"])'
}

zk_ok() { [ "$(echo ruok | timeout 1 bash -c 'exec 3<>/dev/tcp/127.0.0.1/2181; cat >&3; cat <&3' 2>/dev/null)" = imok ]; }

# ZooKeeper, an optional service (slow to install: Java): Debian's package (not zookeeperd: no
# systemd here). The tests of its backend start their own servers from it (loadtest/servers/zookeeper.py).
install_zookeeper() {
  [ -f /usr/share/java/zookeeper.jar ] || { say "installing zookeeper"; apt_install --no-install-recommends zookeeper; }
}

# For LOCKS_BACKEND=zookeeper only: a standalone server on 127.0.0.1:2181 started with java
# directly (docs: scaleout.md section 4).
ensure_zookeeper() {
  install_zookeeper
  zk_ok && return
  local d=${TMPDIR:-/tmp}/shop-zookeeper
  mkdir -p "$d/data"
  # tickTime 1000: sessions of 2-20 s (LOCKS_ZOOKEEPER_SESSION_TIMEOUT); no AdminServer on :8080.
  cat > "$d/zoo.cfg" <<EOC
tickTime=1000
dataDir=$d/data
clientPort=2181
clientPortAddress=127.0.0.1
maxClientCnxns=200
admin.enableServer=false
4lw.commands.whitelist=ruok,stat,srvr,mntr,envi,conf
EOC
  say "starting ZooKeeper on 127.0.0.1:2181"
  nohup java -Xmx256m -Dzookeeper.admin.enableServer=false \
    -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar \
    org.apache.zookeeper.server.ZooKeeperServerMain "$d/zoo.cfg" > "$d/zk.log" 2>&1 &
  echo $! > "$d/zk.pid"
  for _ in $(seq 100); do zk_ok && return; sleep 0.1; done
  echo "ZooKeeper did not answer ruok; see $d/zk.log" >&2; return 1
}

ensure_venv() {
  local reqs=$1 sum stamp
  [ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
  sum=$(cat requirements*.txt | sha1sum | cut -c1-12)
  stamp="$VENV/.installed-$(basename "$reqs")-$sum"
  # requirements-dev.txt includes the others: a venv set up for the tests serves `run` as it is.
  if [ ! -f "$stamp" ] && [ ! -f "$VENV/.installed-requirements-dev.txt-$sum" ]; then
    say "installing $reqs"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    "$VENV/bin/pip" install -q -r "$reqs"
    touch "$stamp"
  fi
}

setup() {
  local mode=${1:-run}
  ensure_dev_env_file
  say_where
  ensure_packages "$mode"
  ensure_redis
  ensure_mariadb
  if [ "$mode" = test ]; then ensure_venv requirements-dev.txt; else ensure_venv requirements.txt; fi
  # Each optional service only where it is used: the ZooKeeper backend's tests, or the settings.
  if [ "$mode" = test ]; then install_zookeeper; fi
  if [ "$(configured_locks_backend)" = zookeeper ]; then ensure_zookeeper; fi
  "$VENV/bin/python" manage.py createdb
  "$VENV/bin/python" manage.py migrate --no-input -v 0
  # Static files the standard way: WhiteNoise serves STATIC_ROOT, so the stylesheet also loads
  # with DEBUG off.
  "$VENV/bin/python" manage.py collectstatic --no-input -v 0
}

# The fast tier (tests/conftest.py says which tests): the venv and nothing else; MariaDB and Redis
# pointed at a closed port, so a test that needs them fails here rather than passing on a service
# that happens to run. Two workers: the tier is CPU-bound.
fast_tier() {
  export DJANGO_SETTINGS_MODULE=tests.settings
  export DATABASE_URL=mysql://root@127.0.0.1:1/fast_tier_has_no_database REDIS_URL=redis://127.0.0.1:1/0 \
    LOCKS_REDIS_URL=redis://127.0.0.1:1/0 LOCKS_BACKEND=redis LOCKS_ZOOKEEPER_HOSTS=127.0.0.1:1
  say "the fast tier (pytest -m fast): no services, the database and Redis at a closed port"
  "$VENV/bin/python" -m pytest -m fast -n "${TEST_WORKERS:-2}" "$@"
}

case "${1:-}" in
  run)
    port=${PORT:-8000}
    check_port "$port"
    setup run
    SEED_DEMO=1 "$VENV/bin/python" manage.py seed_demo
    check_port "$port"
    # Exported (over any PORT in .env), so the settings of the server and of run_jobs know the
    # port served: the links in the mail the jobs send (SITE_URL, unless set) follow it.
    export PORT=$port
    say "serving on http://127.0.0.1:$port (admin: /admin/, user admin / password admin);" \
      "run_jobs runs beside it (expires unpaid orders, sends mail, finishes refunds); Ctrl-C stops both"
    serve "$port"
    ;;
  test)
    shift
    setup test
    # The suite's own settings (tests/settings.py: a throwaway key, the fast hasher, the test
    # defaults), not the config.settings exported above for manage.py.
    export DJANGO_SETTINGS_MODULE=tests.settings
    # Its own test database per checkout too (the suite does not read .env.dev).
    export TEST_DATABASE_NAME=${TEST_DATABASE_NAME:-test_$(checkout_database)}
    say "the tests use the database $TEST_DATABASE_NAME"
    if [ $# -gt 0 ]; then exec "$VENV/bin/python" -m pytest "$@"; fi
    # Every test once, in two tiers: the fast tier first, with the services out of reach (as
    # `./dev.sh fast` runs it), then the rest. One pass: there is one checkout path (batch size 1
    # with combining off is tested by the tests parametrized over SHOP["COMBINING"]). Three
    # pytest-xdist workers on two cores: most tests wait (on servers, subprocesses, leases), not
    # compute. Each has its own test database (suffixed _gw0, _gw1, ...); a module's tests stay on
    # one worker (its browser, servers and clusters shared); a test marked `alone` runs while the
    # other workers wait. Both tiers run whatever the first gives; the exit status is the worse.
    fast_rc=0 rest_rc=0
    (fast_tier) || fast_rc=$?
    say "the rest of the suite (pytest -m 'not fast'), on MariaDB and Redis"
    "$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-3}" --dist loadfile -m "not fast and not liveness" || rest_rc=$?
    [ "$fast_rc" = 0 ] || say "the fast tier failed (exit $fast_rc)"
    exit $((rest_rc > fast_rc ? rest_rc : fast_rc))
    ;;
  fast)
    shift
    # The fast tier (tests/conftest.py says which tests): the venv and nothing else; MariaDB and
    # Redis pointed at a closed port, so a test that needs them fails here rather than passing
    # on a service that happens to run. Two workers: the tier is CPU-bound.
    ensure_packages fast
    ensure_venv requirements-dev.txt
    fast_tier "$@"
    ;;
  check)
    ensure_packages fast
    ensure_venv requirements-dev.txt
    export DJANGO_SETTINGS_MODULE=tests.settings  # what mypy's Django plugin loads (pyproject.toml)
    say "ruff check"
    "$VENV/bin/ruff" check .
    say "mypy (strict on locks/; pyproject.toml)"
    "$VENV/bin/mypy"
    ;;
  setup)
    setup "${2:-run}"
    ;;
  where)
    ensure_dev_env_file
    say_where
    ;;
  *)
    echo "usage: ./dev.sh run | test [pytest args] | fast [pytest args] | check | setup [run|test] | where" >&2
    exit 2
    ;;
esac
