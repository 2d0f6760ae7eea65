#!/usr/bin/env bash
# The reconnect storm (ARCHITECTURE.md §3, reconnect grace): builds release binaries, then
# twice starts a fresh embedded Herald (dev mode, a temporary data dir) — with the default
# reconnect grace period, then with it off — and runs herald-reconnect against it: N devices,
# each in C conversations read to the end, drop at once, get one message each while away,
# and all reconnect at once.
#
#   scripts/reconnect-bench.sh [herald-reconnect flags, e.g. --users 1000 --conversations 80]
#
# In cluster mode the devices come back to another node, as behind a load balancer that
# picks any node: three nodes on the local PostgreSQL and Redis (scripts/cluster-lib.sh),
# the devices set up on node 0 and reconnecting to node 1, which takes their parked
# sessions over from node 0 (grace on) or backfills them in full (grace off).
#
#   scripts/reconnect-bench.sh cluster [herald-reconnect flags]
#
# A node restarted behind nginx (placement): three nodes (`cluster.placement =
# "nginx-consistent"`) behind a real nginx configured by `herald cluster nginx-conf`,
# herald-restart's devices connecting through it; node 1 is stopped (SIGTERM, then in a
# second pair of runs kill -9) and started again at the same address, with the restore of
# its devices (`cluster.restore_devices`) on, then off.
#
#   scripts/reconnect-bench.sh restart [herald-restart flags, e.g. --users 6000]
#   STOPS=KILL RESTORES=true scripts/reconnect-bench.sh restart     # one of the four runs
#
# The restarted node's log is kept as NODE1_LOG (default: target/restart-bench-node1.log).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

if [ "${1:-}" = restart ]; then
    shift
    . scripts/services.sh
    . scripts/cluster-lib.sh
    ensure_nginx
    # nginx, the nodes and the tool each hold a descriptor per connection (nginx two).
    ulimit -n "$(ulimit -Hn)"
    cargo build --release --locked --bin herald-restart >&2
    say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p'); three nodes, nginx and the clients on the same box"
    node1_log=${NODE1_LOG:-target/restart-bench-node1.log}
    : > "$node1_log"
    nginx_dir="$work/nginx"
    stop_nginx() { [ -f "$nginx_dir/nginx.pid" ] && kill -TERM "$(cat "$nginx_dir/nginx.pid")" 2>/dev/null || true; sleep 0.5; }
    trap 'stop_nginx; [ -f "$work/node1.pid" ] && kill "$(cat "$work/node1.pid")" 2>/dev/null; cleanup' EXIT
    for stop in ${STOPS:-TERM KILL}; do
        for restore in ${RESTORES:-true false}; do
            name="restart_${stop,,}_$restore"
            settings=(HERALD_CLUSTER__PLACEMENT=nginx-consistent HERALD_GATEWAY__RECONNECT_GRACE_MS=60000
                HERALD_CLUSTER__RESTORE_DEVICES=$restore)
            start_cluster 3 "$name" "${settings[@]}"
            mkdir -p "$nginx_dir"
            for kind in client_body proxy fastcgi uwsgi scgi; do mkdir -p "$nginx_dir/$kind"; done
            target/release/herald cluster nginx-conf --url http://127.0.0.1:7400 --key dev-key --listen 127.0.0.1:7480 \
                | sed "s|^http {|http {\n    access_log off;\n    client_body_temp_path $nginx_dir/client_body; proxy_temp_path $nginx_dir/proxy; fastcgi_temp_path $nginx_dir/fastcgi; uwsgi_temp_path $nginx_dir/uwsgi; scgi_temp_path $nginx_dir/scgi;|" \
                > "$nginx_dir/nginx.conf"
            nginx -p "$nginx_dir" -c "$nginx_dir/nginx.conf" -e "$nginx_dir/error.log" \
                -g "daemon on; pid $nginx_dir/nginx.pid; user root;" || die "nginx did not start: $(cat "$nginx_dir/error.log")"
            # Node 1 again, exactly as start_cluster started it, at the same address.
            node1_pid=${pids[1]}
            cat > "$work/start-node1.sh" <<START
env ${settings[*]} RUST_LOG=warn HERALD_WORKER_THREADS=$(threads_per_node 3) HERALD_STORAGE__URL="${admin%/*}/herald_bench_${run_id}_$name" \
    HERALD_CLUSTER__REDIS_URL="$redis_url" HERALD_CLUSTER__KEY_PREFIX="bench$run_id:$name:" HERALD_CLUSTER__PEER_LISTEN=127.0.0.1:7411 \
    ${herald_bin:-target/release/herald} serve --dev --listen 127.0.0.1:7410 --data-dir "$work/$name-1" >>"$node1_log" 2>&1 &
echo \$! > "$work/node1.pid"
for _ in \$(seq 1 300); do curl -sf http://127.0.0.1:7410/readyz >/dev/null && exit 0; sleep 0.05; done
exit 1
START
            label="SIGTERM"
            [ "$stop" = KILL ] && label="kill -9"
            label="$label, restore $([ "$restore" = true ] && echo on || echo off)"
            target/release/herald-restart --url ws://127.0.0.1:7480/v1/ws --notifier-url ws://127.0.0.1:7400/v1/ws \
                --metrics-url http://127.0.0.1:7410 \
                --stop "kill -$stop $node1_pid; while ps -o stat= -p $node1_pid | grep -qv Z; do sleep 0.02; done" \
                --start "sh $work/start-node1.sh" --label "$label" "$@"
            stop_nginx
            [ -f "$work/node1.pid" ] && { kill "$(cat "$work/node1.pid")" 2>/dev/null || true; rm -f "$work/node1.pid"; }
            stop_nodes
        done
    done
    exit 0
fi

if [ "${1:-}" = cluster ]; then
    shift
    . scripts/services.sh
    . scripts/cluster-lib.sh
    cargo build --release --locked --bin herald-reconnect >&2
    say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p'); three nodes and the clients on the same box"
    for grace in 30000 0; do
        start_cluster 3 "grace$grace" "HERALD_GATEWAY__RECONNECT_GRACE_MS=$grace"
        label="3 nodes, back on another node, grace ${grace} ms"
        [ "$grace" = 0 ] && label="3 nodes, back on another node, grace off"
        target/release/herald-reconnect --url ws://127.0.0.1:7400/v1/ws --back-url ws://127.0.0.1:7410/v1/ws \
            --label "$label" "$@"
        stop_nodes
    done
    exit 0
fi

say "building release binaries"
cargo build --release --locked --bin herald --bin herald-reconnect >&2
say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p'); the clients on the same box"
port=${HERALD_LOADTEST_PORT:-7098}
data=""
trap 'stop_herald; [ -z "$data" ] || rm -rf "$data"' EXIT
for grace in 30000 0; do
    data=$(mktemp -d)
    start_herald "$port" "$data" "HERALD_GATEWAY__RECONNECT_GRACE_MS=$grace"
    label="grace ${grace} ms"
    [ "$grace" = 0 ] && label="grace off"
    target/release/herald-reconnect --url "ws://127.0.0.1:$port/v1/ws" --label "$label" "$@"
    stop_herald
    rm -rf "$data"
    data=""
done
