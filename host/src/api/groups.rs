//! Groups: create, add and remove members (api key).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, require_api_key};
use crate::model::{GroupId, UserId};
use crate::node::Node;
use crate::store::StoreError;

/// Most members a group may be created with in one call.
const MAX_INITIAL_MEMBERS: usize = 10_000;

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

fn store_error(error: StoreError) -> ApiError {
    match error {
        StoreError::GroupExists(id) => {
            ApiError::new(StatusCode::CONFLICT, "exists", format!("group {id} already exists"))
        }
        StoreError::NoSuchGroup(id) => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("there is no group {id}"))
        }
        other => ApiError::unavailable(other),
    }
}

/// `POST /v1/groups {"id","members"}` → 201.
pub async fn create(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Result<Json<CreateGroup>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    require_api_key(&node, &headers)?;
    let Json(request) = body.map_err(|error| ApiError::bad_request(error.body_text()))?;
    let id = group_id(&request.id)?;
    if request.members.len() > MAX_INITIAL_MEMBERS {
        return Err(ApiError::bad_request(format!("at most {MAX_INITIAL_MEMBERS} members per call")));
    }
    let mut members = request.members.iter().map(|m| user_id(m)).collect::<Result<Vec<_>, _>>()?;
    members.sort();
    members.dedup();
    node.database.create_group(&id, &members, node.clock.now_ms()).await.map_err(store_error)?;
    node.membership.invalidate(&id);
    let names: Vec<&str> = members.iter().map(UserId::as_str).collect();
    Ok((StatusCode::CREATED, Json(json!({ "id": id.as_str(), "conversation": format!("grp:{id}"), "members": names }))))
}

/// `PUT /v1/groups/{id}/members/{user}` → 204.
pub async fn add_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path((id, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    require_api_key(&node, &headers)?;
    let (id, user) = (group_id(&id)?, user_id(&user)?);
    node.database.add_member(&id, &user, node.clock.now_ms()).await.map_err(store_error)?;
    node.membership.invalidate(&id);
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/groups/{id}/members/{user}` → 204, or 404 when not a member.
pub async fn remove_member(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path((id, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    require_api_key(&node, &headers)?;
    let (id, user) = (group_id(&id)?, user_id(&user)?);
    let removed = node.database.remove_member(&id, &user).await.map_err(store_error)?;
    node.membership.invalidate(&id);
    if removed {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("{user} is not a member of grp:{id}")))
    }
}
