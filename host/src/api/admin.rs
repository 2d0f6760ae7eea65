//! `/admin/*` (admin key): the plugins' status and an immediate reload, health, the ring,
//! the charts' time series; and `/admin` itself, the page that shows them all (a static
//! page holding no data: it asks for the admin key and calls the endpoints with it).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse};
use serde_json::{Value, json};

use super::{ApiError, key_id, path_params, require_key};
use crate::health::TIMELINE_POINTS;
use crate::model::{ConversationId, UserId};
use crate::node::Node;
use crate::plugins::types::CommandKind;
use crate::plugins::{PromoteError, RecordingError, RecordingOptions};

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

/// A request made with an admin key (`api.admin_keys`; `dev-key` in dev mode), checked
/// before anything else of the request is read: a handler that takes one (before its body)
/// runs for an admin only, and anyone else gets `401` whatever the rest of the request.
/// `key_id` names the key in the audit trail: a digest, never the key.
pub(super) struct Admin {
    pub key_id: String,
}

impl FromRequestParts<Arc<Node>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, node: &Arc<Node>) -> Result<Self, ApiError> {
        require_key(node, &parts.headers, &node.config().api.admin_keys, "admin key")?;
        Ok(Self { key_id: key_id(&parts.headers) })
    }
}

/// `GET /admin/plugins`: name, version, content hash, hooks, calls, failures, p99 call
/// time and state (with the last load error) of every plugin.
pub async fn plugins(State(node): State<Arc<Node>>, _admin: Admin) -> Result<Json<Value>, ApiError> {
    let registry = match node.plugin_registry().listing().await {
        Ok(listing) => listing,
        // The folder's plugins are still worth showing while the database does not answer.
        Err(error) => json!({ "error": error.to_string() }),
    };
    let overridden = node.plugins().overridden_files();
    Ok(Json(json!({ "plugins": node.plugins().status(), "registry": registry, "overridden_files": overridden })))
}

/// `GET /admin/health`: the last health sample, the delivery tier chosen from it and why,
/// and the circuit breakers.
pub async fn health(State(node): State<Arc<Node>>, _admin: Admin) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({
        "tier": node.vitals().tier(),
        "tier_reason": node.vitals().tier_reason(),
        "health": node.vitals().last_sample(),
        "breakers": node.breakers(),
    })))
}

/// `GET /admin/series`: one point per health sample (`delivery.degrade_interval_ms`) over
/// the last [`TIMELINE_POINTS`] samples, oldest first: messages stored per second, the
/// send→deliver-ack p99, connections and the send backlog.
pub async fn series(State(node): State<Arc<Node>>, _admin: Admin) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({
        "interval_ms": node.config().delivery.degrade_interval_ms,
        "capacity": TIMELINE_POINTS,
        "points": node.vitals().timeline(),
    })))
}

/// Query of `GET /admin/route`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteQuery {
    user: String,
    conversation: Option<String>,
    /// `send` (the default), `sync`, `history`, `subscribe`, …, or `connect`.
    command: Option<String>,
}

/// `GET /admin/route?user=U&conversation=C&command=send`: the routing key the route-key
/// hook (or the built-in default) gives that command, and the node owning it. With
/// `command=connect`: the user's home node as `owner` (where nginx sends its connections
/// under `cluster.placement`; `null` without placement).
pub async fn route(
    State(node): State<Arc<Node>>,
    _admin: Admin,
    query: Result<Query<RouteQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|error| ApiError::rejected(error.status(), error.body_text()))?;
    let invalid = |message: String| ApiError::bad_request(message);
    let user = UserId::parse(&query.user).map_err(|error| invalid(error.to_string()))?;
    let conversation = query
        .conversation
        .as_deref()
        .map(ConversationId::parse)
        .transpose()
        .map_err(|error| invalid(error.to_string()))?;
    if query.command.as_deref() == Some("connect") {
        let routed = node.home(&user);
        let placement = node.ring().homes.placement().name();
        return Ok(Json(json!({
            "key": routed.key, "owner": routed.owner, "this_node": node.this_node(), "placement": placement
        })));
    }
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
                "unknown command {other:?}; use send, deliver_ack, sync, history, subscribe, unsubscribe, announce \
                 or connect"
            )));
        }
    };
    let routed = node.route(command, &user, conversation.as_ref()).await;
    Ok(Json(json!({ "key": routed.key, "owner": routed.owner, "this_node": node.this_node() })))
}

/// `GET /admin/cluster`: this node, the nodes on the ring and how they share it, and
/// placement (nginx's upstream, its digest, connections away from home and requests from
/// a stale nginx); in cluster mode also the live members with their addresses, this node's
/// lease and its circuit breakers (on Redis, and on each peer it called). Embedded mode is
/// one node owning every key.
pub async fn cluster(State(node): State<Arc<Node>>, _admin: Admin) -> Result<Json<Value>, ApiError> {
    let view = node.ring();
    let ring = &view.ring;
    let nodes = ring.nodes().iter().map(|id| json!({ "id": id, "points": ring.points_of(*id) })).collect::<Vec<_>>();
    let placement = node.placement().map(|placement| {
        let mut status = json!(placement);
        // What `herald cluster nginx-conf` sizes nginx's timeouts by.
        status["heartbeat_ms"] = json!(node.config().gateway.heartbeat_ms);
        status
    });
    Ok(Json(match node.cluster_status() {
        None => json!({
            "mode": "embedded", "this_node": node.this_node(), "epoch": view.epoch, "nodes": nodes, "placement": placement
        }),
        Some(status) => {
            let members = status.members.iter().map(|(id, address)| json!({ "id": id, "advertise": address }));
            json!({
                "mode": "cluster",
                "this_node": node.this_node(),
                "epoch": view.epoch,
                "nodes": nodes,
                "members": members.collect::<Vec<_>>(),
                "lease": { "held": status.holds_lease, "advertise": status.advertise, "peer_listen": status.peer_listen },
                "breakers": status.breakers,
                "placement": placement,
            })
        }
    }))
}

/// `POST /admin/plugins/reload`: reloads the plugins folder now.
pub async fn reload(State(node): State<Arc<Node>>, _admin: Admin) -> Result<Json<Value>, ApiError> {
    let plugins = node
        .plugins()
        .reload()
        .await
        .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "reload_failed", error.to_string()))?;
    Ok(Json(json!({ "plugins": plugins })))
}

/// `POST /admin/plugins/{name}/recording` with optional [`RecordingOptions`] as JSON:
/// starts recording the plugin's hook calls to `<data_dir>/recordings/NAME-<ms>.jsonl`
/// (sdk/README.md, "Record and replay"). 404 when no such plugin is loaded, 409 when it is
/// being recorded already, 400 for bad options.
pub async fn start_recording(
    State(node): State<Arc<Node>>,
    _admin: Admin,
    name: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let name = path_params(name)?;
    let options = if body.iter().all(u8::is_ascii_whitespace) {
        RecordingOptions::default()
    } else {
        serde_json::from_slice::<RecordingOptions>(&body)
            .map_err(|error| ApiError::bad_request(format!("recording options: {error}")))?
    };
    let file = node.config().data_dir.join("recordings").join(format!("{name}-{}.jsonl", node.now_ms()));
    let status = node.plugins().start_recording(&name, file, options).map_err(|error| match error {
        RecordingError::NotLoaded(_) => ApiError::not_found(error.to_string()),
        RecordingError::AlreadyRecording { .. } => ApiError::new(StatusCode::CONFLICT, "conflict", error.to_string()),
        RecordingError::BadOptions(_) => ApiError::bad_request(error.to_string()),
        RecordingError::Io { .. } => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "recording_failed", error.to_string())
        }
    })?;
    Ok(Json(json!({ "plugin": name, "recording": status })))
}

/// `DELETE /admin/plugins/{name}/recording`: stops the plugin's recording; 404 when none
/// runs.
pub async fn stop_recording(
    State(node): State<Arc<Node>>,
    _admin: Admin,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_params(name)?;
    match node.plugins().stop_recording(&name) {
        Some(status) => Ok(Json(json!({ "plugin": name, "recording": status }))),
        None => Err(ApiError::not_found(format!("plugin `{name}` is not being recorded"))),
    }
}

/// `POST /admin/plugins/{name}/promote`: for a plugin the registry deploys, its shadow
/// becomes its active version on every node (`registry.rs`, a deploy's two phases) and is
/// watched as the cluster's canary. Otherwise the plugin's shadow (`NAME.shadow.wasm`) becomes
/// its active version and is watched for `plugin_runtime.canary.window_ms`, rolled back by
/// itself past the canary bounds (sdk/README.md, "Shadow runs and canaries"). 404 when it
/// has no shadow.
pub async fn promote(
    State(node): State<Arc<Node>>,
    admin: Admin,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_params(name)?;
    if node.plugins().managed().contains(&name) {
        return Ok(Json(node.plugin_registry().promote(&name, &admin.key_id).await?));
    }
    match node.plugins().promote(&name).await {
        Ok(status) => Ok(Json(json!({ "plugin": status }))),
        Err(error @ PromoteError::NoShadow(_)) => Err(ApiError::not_found(error.to_string())),
        Err(error) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "promote_failed", error.to_string())),
    }
}

/// `DELETE /admin/plugins/{name}/shadow`: removes the plugin's shadow (its files too); 404
/// when it has none.
pub async fn discard_shadow(
    State(node): State<Arc<Node>>,
    _admin: Admin,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_params(name)?;
    match node.plugins().discard_shadow(&name).await {
        Ok(true) => Ok(Json(json!({ "plugin": name, "shadow": null }))),
        Ok(false) => Err(ApiError::not_found(format!("plugin `{name}` has no shadow"))),
        Err(error) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "discard_failed", error.to_string())),
    }
}
