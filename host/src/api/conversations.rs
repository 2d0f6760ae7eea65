//! Conversation history over HTTP, for a member's token.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, require_user};
use crate::delivery::wire_message;
use crate::model::ConversationId;
use crate::node::Node;
use crate::pipeline::membership::Refusal;

#[derive(Deserialize)]
pub struct Page {
    #[serde(default)]
    after_seq: u64,
    #[serde(default)]
    limit: Option<u32>,
}

/// `GET /v1/conversations/{conversation}/messages?after_seq=&limit=` → messages in
/// ascending seq, in the proto3 JSON mapping of `Message`.
pub async fn messages(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(conversation): Path<String>,
    page: Result<Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let user = require_user(&node, &headers)?;
    let Query(page) = page.map_err(|error| ApiError::bad_request(error.body_text()))?;
    let conversation =
        ConversationId::parse(&conversation).map_err(|error| ApiError::bad_request(error.to_string()))?;
    node.membership.check_read(&user, &conversation).await.map_err(|refusal| match refusal {
        Refusal::Store(error) => ApiError::unavailable(error),
        other => ApiError::new(StatusCode::FORBIDDEN, "forbidden", other.to_string()),
    })?;
    let limit = page.limit.unwrap_or(100).clamp(1, node.config.delivery.max_page);
    let stored =
        node.database.messages_after(&conversation, page.after_seq, limit).await.map_err(ApiError::unavailable)?;
    let messages: Vec<Value> =
        stored.iter().map(|m| serde_json::to_value(wire_message(m)).unwrap_or(Value::Null)).collect();
    Ok(Json(
        json!({ "conversation": conversation.as_str(), "messages": messages, "has_more": stored.len() as u32 == limit }),
    ))
}
