//! `/admin/*` (admin key): the plugins' status and an immediate reload, health, the ring,
//! the charts' time series; and `/admin` itself, the page that shows them all (a static
//! page holding no data: it asks for the admin key and calls the endpoints with it).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse};
use serde_json::{Value, json};

use super::{ApiError, require_key};
use crate::health::TIMELINE_POINTS;
use crate::model::{ConversationId, UserId};
use crate::node::Node;
use crate::plugins::types::CommandKind;

/// The admin page (`host/src/api/admin.html`).
const ADMIN_PAGE: &str = include_str!("admin.html");

/// `GET /admin`: the admin page. It holds no data, so it needs no key; everything it shows
/// comes from the endpoints below, called with the key the operator types in.
pub async fn page() -> impl IntoResponse {
    // The page runs only its own script and talks only to this server.
    let policy = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                  connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
    ([(header::CONTENT_SECURITY_POLICY, policy), (header::CACHE_CONTROL, "no-store")], Html(ADMIN_PAGE))
}

fn require_admin_key(node: &Node, headers: &HeaderMap) -> Result<(), ApiError> {
    require_key(node, headers, &node.config.api.admin_keys, "admin key")
}

/// `GET /admin/plugins`: name, version, content hash, hooks, calls, failures, p99 call
/// time and state (with the last load error) of every plugin.
pub async fn plugins(State(node): State<Arc<Node>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    require_admin_key(&node, &headers)?;
    Ok(Json(json!({ "plugins": node.plugins.host.status() })))
}

/// `GET /admin/health`: the last health sample, the delivery tier chosen from it and why,
/// and the circuit breakers.
pub async fn health(State(node): State<Arc<Node>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    require_admin_key(&node, &headers)?;
    Ok(Json(json!({
        "tier": node.vitals.tier(),
        "tier_reason": node.vitals.tier_reason(),
        "health": node.vitals.last_sample(),
        "breakers": node.breakers(),
    })))
}

/// `GET /admin/series`: one point per health sample (`delivery.degrade_interval_ms`) over
/// the last [`TIMELINE_POINTS`] samples, oldest first: messages stored per second, the
/// send→deliver-ack p99, connections and the send backlog.
pub async fn series(State(node): State<Arc<Node>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    require_admin_key(&node, &headers)?;
    Ok(Json(json!({
        "interval_ms": node.config.delivery.degrade_interval_ms,
        "capacity": TIMELINE_POINTS,
        "points": node.vitals.timeline(),
    })))
}

/// Query of `GET /admin/route`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteQuery {
    user: String,
    conversation: Option<String>,
    /// `send` (the default), `sync`, `history`, `subscribe`, …
    command: Option<String>,
}

/// `GET /admin/route?user=U&conversation=C&command=send`: the routing key the route-key
/// hook (or the built-in default) gives that command, and the node owning it.
pub async fn route(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    query: Result<Query<RouteQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    require_admin_key(&node, &headers)?;
    let Query(query) = query.map_err(|error| ApiError::rejected(error.status(), error.body_text()))?;
    let invalid = |message: String| ApiError::bad_request(message);
    let user = UserId::parse(&query.user).map_err(|error| invalid(error.to_string()))?;
    let conversation = query
        .conversation
        .as_deref()
        .map(ConversationId::parse)
        .transpose()
        .map_err(|error| invalid(error.to_string()))?;
    let command = match query.command.as_deref().unwrap_or("send") {
        "send" => CommandKind::Send,
        "deliver_ack" => CommandKind::DeliverAck,
        "sync" => CommandKind::Sync,
        "history" => CommandKind::History,
        "subscribe" => CommandKind::Subscribe,
        "unsubscribe" => CommandKind::Unsubscribe,
        "announce" => CommandKind::Announce,
        other => {
            return Err(invalid(format!(
                "unknown command {other:?}; use send, deliver_ack, sync, history, subscribe, unsubscribe or announce"
            )));
        }
    };
    let routed = node.router.route(command, &user, conversation.as_ref()).await;
    Ok(Json(json!({ "key": routed.key, "owner": routed.owner, "this_node": node.this_node() })))
}

/// `GET /admin/cluster`: this node, the nodes on the ring and how they share it; in
/// cluster mode also the live members with their addresses, this node's lease and its
/// circuit breakers (on Redis, and on each peer it called). Embedded
/// mode is one node owning every key.
pub async fn cluster(State(node): State<Arc<Node>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    require_admin_key(&node, &headers)?;
    let view = node.router.topology().view();
    let ring = &view.ring;
    let nodes = ring.nodes().iter().map(|id| json!({ "id": id, "points": ring.points_of(*id) })).collect::<Vec<_>>();
    Ok(Json(match &node.cluster {
        None => json!({ "mode": "embedded", "this_node": node.this_node(), "epoch": view.epoch, "nodes": nodes }),
        Some(cluster) => {
            let status = cluster.status();
            let members = status.members.iter().map(|(id, address)| json!({ "id": id, "advertise": address }));
            json!({
                "mode": "cluster",
                "this_node": node.this_node(),
                "epoch": view.epoch,
                "nodes": nodes,
                "members": members.collect::<Vec<_>>(),
                "lease": { "held": status.holds_lease, "advertise": status.advertise, "peer_listen": status.peer_listen },
                "breakers": status.breakers,
            })
        }
    }))
}

/// `POST /admin/plugins/reload`: reloads the plugins folder now.
pub async fn reload(State(node): State<Arc<Node>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    require_admin_key(&node, &headers)?;
    let plugins = node
        .plugins
        .host
        .reload()
        .await
        .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "reload_failed", error.to_string()))?;
    Ok(Json(json!({ "plugins": plugins })))
}
