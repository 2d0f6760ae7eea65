//! Users: dev tokens and presence.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, path_params, require_api_key};
use crate::model::UserId;
use crate::node::Node;

/// How long a dev token lasts.
const DEV_TOKEN_TTL_SECS: u64 = 24 * 3600;

#[derive(Deserialize)]
pub struct TokenRequest {
    user: String,
}

/// `POST /v1/dev/token {"user"}` → `{"token"}`, dev mode only.
pub async fn dev_token(
    State(node): State<Arc<Node>>,
    body: Result<Json<TokenRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    if !node.config().dev {
        return Err(ApiError::not_found("dev tokens exist in dev mode only"));
    }
    let Json(request) = body.map_err(|error| ApiError::rejected(error.status(), error.body_text()))?;
    let user = UserId::parse(&request.user).map_err(|error| ApiError::bad_request(error.to_string()))?;
    let token = node
        .issue_token(&user, DEV_TOKEN_TTL_SECS)
        .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string()))?;
    Ok(Json(json!({ "token": token })))
}

/// `GET /v1/users/{user}/presence` → online devices and their nodes, and when the user was
/// last seen: now while a device is connected, else when the last one left (`null` when
/// none left within [`LAST_SEEN_KEPT`](crate::routing::LAST_SEEN_KEPT)).
pub async fn presence(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    user: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    require_api_key(&node, &headers)?;
    let user = path_params(user)?;
    let user = UserId::parse(&user).map_err(|error| ApiError::bad_request(error.to_string()))?;
    let presence = node.presence(&user).await.map_err(ApiError::unavailable)?;
    let devices: Vec<Value> = presence
        .devices
        .iter()
        .map(|route| json!({ "device": route.device.as_str(), "node_id": route.node, "connected_at_ms": route.connected_at_ms }))
        .collect();
    Ok(Json(json!({
        "user": user.as_str(),
        "online": !devices.is_empty(),
        "devices": devices,
        "last_seen_ms": presence.last_seen_ms,
    })))
}
