//! Groups: create, add and remove members (api key).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, path_params, require_api_key};
use crate::membership::GroupChange;
use crate::model::{ConversationId, GroupId, UserId};
use crate::node::Node;

#[derive(Deserialize)]
pub struct CreateGroup {
    id: String,
    #[serde(default)]
    members: Vec<String>,
}

fn group_id(raw: &str) -> Result<GroupId, ApiError> {
    GroupId::parse(raw.strip_prefix("grp:").unwrap_or(raw)).map_err(|error| ApiError::bad_request(error.to_string()))
}

fn user_id(raw: &str) -> Result<UserId, ApiError> {
    UserId::parse(raw).map_err(|error| ApiError::bad_request(error.to_string()))
}

fn change_error(error: GroupChange) -> ApiError {
    match error {
        GroupChange::Exists(_) => ApiError::new(StatusCode::CONFLICT, "exists", error.to_string()),
        GroupChange::NoSuchGroup(_) | GroupChange::NotMember { .. } => ApiError::not_found(error.to_string()),
        GroupChange::Full { .. } => ApiError::new(StatusCode::CONFLICT, "limit_exceeded", error.to_string()),
        GroupChange::Store(error) => ApiError::unavailable(error),
    }
}

/// `POST /v1/groups {"id","members"}` → 201.
pub async fn create(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Result<Json<CreateGroup>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    require_api_key(&node, &headers)?;
    let Json(request) = body.map_err(|error| ApiError::rejected(error.status(), error.body_text()))?;
    let id = group_id(&request.id)?;
    let mut members = request.members.iter().map(|m| user_id(m)).collect::<Result<Vec<_>, _>>()?;
    members.sort();
    members.dedup();
    node.create_group(&id, &members).await.map_err(change_error)?;
    let names: Vec<&str> = members.iter().map(UserId::as_str).collect();
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id.as_str(), "conversation": ConversationId::group(&id).as_str(), "members": names })),
    ))
}

/// `PUT /v1/groups/{id}/members/{user}` → 204.
pub async fn add_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    require_api_key(&node, &headers)?;
    let (id, user) = path_params(params)?;
    let (id, user) = (group_id(&id)?, user_id(&user)?);
    node.add_member(&id, &user).await.map_err(change_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/groups/{id}/members/{user}` → 204, or 404 when not a member.
pub async fn remove_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    require_api_key(&node, &headers)?;
    let (id, user) = path_params(params)?;
    let (id, user) = (group_id(&id)?, user_id(&user)?);
    node.remove_member(&id, &user).await.map_err(change_error)?;
    Ok(StatusCode::NO_CONTENT)
}
