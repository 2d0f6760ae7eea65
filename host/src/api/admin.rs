//! `/admin/*` (admin key): the plugins' status and an immediate reload.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::{ApiError, require_key};
use crate::node::Node;

fn require_admin_key(node: &Node, headers: &HeaderMap) -> Result<(), ApiError> {
    require_key(node, headers, &node.config.api.admin_keys, "admin key")
}

/// `GET /admin/plugins`: name, version, content hash, hooks, calls, failures, p99 call
/// time and state (with the last load error) of every plugin.
pub async fn plugins(State(node): State<Arc<Node>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    require_admin_key(&node, &headers)?;
    Ok(Json(json!({ "plugins": node.plugins.host.status() })))
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
