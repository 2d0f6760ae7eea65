//! `POST /v1/rooms/{name}/announcements` (api key): announcements from game servers.
//!
//! The announce-policy hook decides: defer (429 with `Retry-After`), a duplicate of an
//! accepted `announcement_id`, or accept — archived (stored as a room message, so a client
//! that subscribes later catches up on it: the announcement never exists only in flight)
//! or not (pushed to the room's subscribers now only). Each request is decided on its own,
//! so pacing one room never delays another.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, path_params, require_api_key};
use crate::model::{ConversationId, UserId};
use crate::node::Node;
use crate::plugins::types::{AnnounceDecision, Announcement};

/// Sender of an announcement that names none.
const DEFAULT_SENDER: &str = "announcer";
/// Longest announcement accepted, in bytes.
const MAX_CONTENT_BYTES: usize = 64 * 1024;

#[derive(Deserialize)]
pub struct AnnouncementRequest {
    content: String,
    #[serde(default)]
    announcement_id: Option<String>,
    #[serde(default)]
    sender: Option<String>,
}

/// `POST /v1/rooms/{name}/announcements`.
pub async fn announce(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<AnnouncementRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    require_api_key(&node, &headers)?;
    let name = path_params(name)?;
    let Json(request) = body.map_err(|error| ApiError::rejected(error.status(), error.body_text()))?;
    let room = ConversationId::parse(&format!("room:{}", name.strip_prefix("room:").unwrap_or(&name)))
        .map_err(|error| ApiError::bad_request(error.to_string()))?;
    if request.content.is_empty() || request.content.len() > MAX_CONTENT_BYTES {
        return Err(ApiError::bad_request(format!("content must be 1..={MAX_CONTENT_BYTES} bytes")));
    }
    if let Some(id) = &request.announcement_id
        && (id.is_empty() || id.len() > 128)
    {
        return Err(ApiError::bad_request("announcement_id must be 1..=128 bytes"));
    }
    let sender = UserId::parse(request.sender.as_deref().unwrap_or(DEFAULT_SENDER))
        .map_err(|error| ApiError::bad_request(error.to_string()))?;

    let announcement = Announcement {
        room: room.to_string(),
        announcement_id: request.announcement_id.clone(),
        sender: request.sender.clone(),
        content: request.content.clone(),
    };
    match node.plugins().announce_policy(&announcement).await {
        AnnounceDecision::Defer(retry_after_ms) => {
            let seconds = retry_after_ms.div_ceil(1000).max(1);
            let body = json!({ "error": { "code": "rate_limited", "message": format!("room {room} is paced; retry after {retry_after_ms} ms"), "retry_after_ms": retry_after_ms } });
            let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            response.headers_mut().insert("retry-after-ms", HeaderValue::from(retry_after_ms));
            Ok(response)
        }
        AnnounceDecision::Duplicate => {
            // Answered like a duplicate send: with the original's ids when it was archived.
            let original = match request.announcement_id.as_deref() {
                Some(id) => node.announcement_original(&room, &sender, id).await.map_err(ApiError::unavailable)?,
                None => None,
            };
            let body = match original {
                Some(original) => json!({
                    "message_id": original.message_id.to_string(),
                    "seq": original.seq.to_string(),
                    "archived": true,
                    "duplicate": true,
                }),
                None => json!({ "duplicate": true, "archived": false }),
            };
            Ok((StatusCode::OK, Json(body)).into_response())
        }
        AnnounceDecision::Accept(acceptance) => {
            let stored = node
                .announce(
                    &room,
                    &sender,
                    request.announcement_id.as_deref(),
                    request.content.into_bytes(),
                    acceptance.archive,
                )
                .await
                .map_err(|error| {
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("not stored: {error}"))
                })?;
            let status = if stored.duplicate { StatusCode::OK } else { StatusCode::ACCEPTED };
            let body = json!({
                "message_id": stored.message_id.to_string(),
                "seq": stored.seq.to_string(),
                "archived": stored.archived,
                "duplicate": stored.duplicate,
            });
            Ok((status, Json(body)).into_response())
        }
    }
}
