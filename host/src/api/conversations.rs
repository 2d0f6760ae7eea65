//! Conversation history over HTTP, for a member's token: the same page as the `history`
//! frame, read forwards.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, path_params, require_user};
use crate::delivery::pull::{PullError, Span};
use crate::delivery::wire_message;
use crate::model::ConversationId;
use crate::node::Node;

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
    conversation: Result<Path<String>, PathRejection>,
    page: Result<Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let user = require_user(&node, &headers)?;
    let conversation = path_params(conversation)?;
    let Query(page) = page.map_err(|error| ApiError::rejected(error.status(), error.body_text()))?;
    let conversation =
        ConversationId::parse(&conversation).map_err(|error| ApiError::bad_request(error.to_string()))?;
    // No limit: the page size `history` uses (0 asks for it); an explicit 0 means 1.
    let limit = page.limit.map_or(0, |limit| limit.max(1));
    let read = node.history(&user, conversation, Span::After(page.after_seq), limit).await;
    let read = read.map_err(|error| match error {
        PullError::Invalid(reason) => ApiError::bad_request(reason),
        PullError::Limit(reason) => ApiError::new(StatusCode::CONFLICT, "limit_exceeded", reason),
        PullError::Store(error) => ApiError::unavailable(error),
        PullError::Refused(crate::membership::Refusal::Store(error)) => ApiError::unavailable(error),
        PullError::Refused(refusal) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", refusal.to_string()),
    })?;
    let messages: Vec<Value> =
        read.messages.iter().map(|m| serde_json::to_value(wire_message(m)).unwrap_or(Value::Null)).collect();
    Ok(Json(json!({ "conversation": read.conversation.as_str(), "messages": messages, "has_more": read.has_more })))
}
