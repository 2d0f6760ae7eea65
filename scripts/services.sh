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

# A 3-master Redis Cluster on loopback for the Redis-backed tests, so they also prove that
# every script and multi-key step stays in one slot (no CROSSSLOT). Three `redis-server
# --cluster-enabled yes` processes on 127.0.0.1:7001-7003 (cluster bus on 17001-17003; the
# base port is HERALD_TEST_REDIS_CLUSTER_PORT), no persistence, no replicas; their
# nodes-PORT.conf and logs in HERALD_TEST_REDIS_CLUSTER_DIR (default
# ${TMPDIR:-/tmp}/herald-redis-cluster). Ports 7001-7003 are clear of scripts/cluster.sh
# (7070 and up) and of the tests' own ports (all picked by the OS).
redis_cluster_base() { echo "${HERALD_TEST_REDIS_CLUSTER_PORT:-7001}"; }
redis_cluster_dir() { echo "${HERALD_TEST_REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/herald-redis-cluster}"; }
redis_cluster_ports() { local base; base=$(redis_cluster_base); echo "$base $((base + 1)) $((base + 2))"; }
# cluster_cli PORT ARGS...: redis-cli on a cluster port, bounded (something else listening
# there might never answer).
cluster_cli() { local port=$1; shift; timeout 3 redis-cli -h 127.0.0.1 -p "$port" "$@"; }

# redis_cluster_url: the URL the tests take (HERALD_TEST_REDIS_URL).
redis_cluster_url() {
    local port nodes=
    for port in $(redis_cluster_ports); do nodes="$nodes,127.0.0.1:$port"; done
    echo "redis+cluster://${nodes#,}"
}

# redis_cluster_healthy: every node answers, is in cluster mode, sees the state ok, all
# 16384 slots assigned and exactly three masters.
redis_cluster_healthy() {
    local port info
    for port in $(redis_cluster_ports); do
        info=$(cluster_cli "$port" cluster info 2>/dev/null | tr -d '\r') || return 1
        grep -qx 'cluster_state:ok' <<<"$info" || return 1
        grep -qx 'cluster_slots_assigned:16384' <<<"$info" || return 1
        grep -qx 'cluster_known_nodes:3' <<<"$info" || return 1
        grep -qx 'cluster_size:3' <<<"$info" || return 1
    done
}

# redis_cluster_node PORT: whether a Redis in cluster mode answers on PORT.
redis_cluster_node() {
    cluster_cli "$1" info cluster 2>/dev/null | tr -d '\r' | grep -qx 'cluster_enabled:1'
}

# ensure_redis_cluster: reuses a healthy cluster on the ports, or starts a fresh one (after
# shutting down what is left of an unhealthy one); prints its URL on stdout. Dies, naming
# the log, when it cannot.
ensure_redis_cluster() {
    local port ports dir nodes=
    ports=$(redis_cluster_ports)
    dir=$(redis_cluster_dir)
    if redis_cluster_healthy; then
        redis_cluster_url
        return 0
    fi
    command -v redis-server >/dev/null && command -v redis-cli >/dev/null \
        || die "a Redis Cluster is needed by the tests but redis-server/redis-cli are not installed (apt-get install redis-server)"
    stop_redis_cluster
    for port in $ports; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            die "port $port is taken by something other than a Redis Cluster node; free it or set HERALD_TEST_REDIS_CLUSTER_PORT"
        fi
    done
    say "starting a 3-master Redis Cluster on 127.0.0.1 ports ${ports// /, } (files in $dir)"
    mkdir -p "$dir"
    for port in $ports; do
        rm -f "$dir/nodes-$port.conf"
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "$dir/nodes-$port.conf" --cluster-node-timeout 5000 \
            --save '' --appendonly no --dir "$dir" --logfile "$dir/redis-$port.log" \
            --pidfile "$dir/redis-$port.pid" --daemonize yes >&2 \
            || die "redis-server did not start on port $port; see $dir/redis-$port.log"
        wait_for "redis $port" cluster_cli "$port" ping \
            || die "Redis did not come up on 127.0.0.1:$port; see $dir/redis-$port.log"
        nodes="$nodes 127.0.0.1:$port"
    done
    # shellcheck disable=SC2086 # one argument per node
    timeout 60 redis-cli --cluster create $nodes --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 \
        || die "redis-cli --cluster create failed; see $dir/create.log"
    wait_for "redis cluster" redis_cluster_healthy \
        || die "the Redis Cluster on ports ${ports// /, } did not reach cluster_state:ok; see $dir/*.log"
    redis_cluster_url
}

# stop_redis_cluster: shuts down the cluster nodes on the ports (only Redis in cluster mode,
# nothing else listening there) and removes their files.
stop_redis_cluster() {
    local port dir
    dir=$(redis_cluster_dir)
    for port in $(redis_cluster_ports); do
        if redis_cluster_node "$port"; then
            cluster_cli "$port" shutdown nosave >/dev/null 2>&1 || true
            wait_for "redis $port to stop" sh -c "! timeout 5 redis-cli -h 127.0.0.1 -p $port ping" \
                || say "warning: the Redis Cluster node on port $port did not stop"
        fi
        rm -f "$dir/nodes-$port.conf" "$dir/redis-$port.log" "$dir/redis-$port.pid"
    done
    rm -f "$dir/create.log"
    rmdir "$dir" 2>/dev/null || true
}
