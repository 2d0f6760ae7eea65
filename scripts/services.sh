# Starts the local services the test suite needs if they are installed but down, and fails
# loudly (never skips) when one cannot be reached. Sourced by scripts/test.sh.

# wait_for NAME CHECK-COMMAND...: up to 30 s.
wait_for() {
    local name=$1; shift
    for _ in $(seq 1 60); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

postgres_up() { psql "${HERALD_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}" -Atc 'SELECT 1'; }
mariadb_up() { mysql -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' test; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }

ensure_postgres() {
    postgres_up >/dev/null 2>&1 && return 0
    if [ -n "${HERALD_TEST_POSTGRES_URL:-}" ]; then
        die "PostgreSQL at HERALD_TEST_POSTGRES_URL=$HERALD_TEST_POSTGRES_URL cannot be reached"
    fi
    command -v pg_ctlcluster >/dev/null || die "PostgreSQL is needed by the tests but is not installed (apt-get install postgresql), or set HERALD_TEST_POSTGRES_URL"
    say "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start >&2 || true
    wait_for postgres postgres_up || die "PostgreSQL did not come up on 127.0.0.1:5432"
}

ensure_mariadb() {
    mariadb_up >/dev/null 2>&1 && return 0
    if [ -n "${HERALD_TEST_MYSQL_URL:-}" ]; then
        # A custom URL: trust it and let the tests report if it is wrong.
        return 0
    fi
    [ -x /usr/sbin/mariadbd ] || die "MariaDB is needed by the tests but is not installed (apt-get install mariadb-server), or set HERALD_TEST_MYSQL_URL"
    say "starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >&2 || true
    wait_for mariadb mariadb_up || die "MariaDB did not come up on 127.0.0.1:3306"
}

ensure_redis() {
    redis_up && return 0
    if [ -n "${HERALD_TEST_REDIS_URL:-}" ]; then
        # A custom URL: trust it and let the tests report if it is wrong.
        return 0
    fi
    command -v redis-server >/dev/null || die "Redis is needed by the tests but is not installed (apt-get install redis-server)"
    say "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2 || true
    wait_for redis redis_up || die "Redis did not come up on 127.0.0.1:6379"
}

ensure_services() {
    ensure_postgres
    ensure_mariadb
    ensure_redis
    say "services up: PostgreSQL, MariaDB, Redis"
}
