//! The plugin registry over HTTP (admin key): `PUT /admin/plugins/{name}/versions/{version}`
//! (the component as the body, the manifest base64-encoded in the `X-Herald-Manifest`
//! header), `POST /admin/plugins/{name}/deploy` `{"version", "as"}`, `POST
//! /admin/plugins/{name}/rollback` and `GET /admin/plugins/{name}/history`; `promote`
//! (`admin.rs`) goes through here for a plugin the registry deploys.
//!
//! Uploads and deploys are outside `api.request_timeout_ms`: a deploy waits for every node
//! to compile and warm the version, bounded by `plugin_registry.deploy_timeout_ms`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use serde_json::{Value, json};

use super::admin::Admin;
use super::{ApiError, path_params};
use crate::node::Node;
use crate::plugins::{RegistryError, Role, Upload};

/// The header an upload's manifest comes in, base64 (standard alphabet, padded).
pub const MANIFEST_HEADER: &str = "x-herald-manifest";

impl From<RegistryError> for ApiError {
    fn from(error: RegistryError) -> Self {
        let message = error.to_string();
        match error {
            RegistryError::Invalid(_) => ApiError::bad_request(message),
            RegistryError::Refused(_) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "refused", message),
            RegistryError::NotFound(_) => ApiError::not_found(message),
            RegistryError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            RegistryError::Aborted(_) => ApiError::new(StatusCode::CONFLICT, "aborted", message),
            RegistryError::Store(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message),
        }
    }
}

/// `PUT /admin/plugins/{name}/versions/{version}`: checks and stores a version. 201 when
/// stored, 200 when the same bytes and manifest were there already; 422 `refused` with
/// why when a check fails, 413 past `plugin_registry.max_component_bytes`, 409 when the
/// version holds another component.
pub async fn upload(
    State(node): State<Arc<Node>>,
    admin: Admin,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let (name, version) = path_params(path)?;
    let max = node.config().plugin_registry.max_component_bytes;
    let component = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "upload refused: the component is larger than plugin_registry.max_component_bytes ({max} bytes)"
                ),
            )
        } else {
            ApiError::bad_request(rejection.body_text())
        }
    })?;
    let manifest = match headers.get(MANIFEST_HEADER) {
        None => String::new(),
        Some(value) => base64::engine::general_purpose::STANDARD
            .decode(value.as_bytes())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "the {MANIFEST_HEADER} header must be the manifest's UTF-8 text in base64"
                ))
            })?,
    };
    let upload = Upload {
        name: name.clone(),
        version: version.clone(),
        component: component.to_vec(),
        manifest,
        key_id: admin.key_id,
    };
    let stored = node.plugin_registry().upload(upload).await?;
    let sha256 = crate::plugins::follow::hash(&component);
    let status = if stored { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({ "plugin": name, "version": version, "sha256": sha256, "stored": stored }))))
}

/// The body of `POST /admin/plugins/{name}/deploy`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployRequest {
    version: String,
    #[serde(rename = "as", default = "active")]
    role: Role,
}

fn active() -> Role {
    Role::Active
}

/// `POST /admin/plugins/{name}/deploy` `{"version", "as": "active"|"shadow"}`: both phases
/// of a deploy; 200 with the new generation once it switched, 409 `aborted` naming the
/// node that could not make it ready and why (nothing changed), 409 `conflict` while
/// another deploy of the plugin is under way.
pub async fn deploy(
    State(node): State<Arc<Node>>,
    admin: Admin,
    name: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let name = path_params(name)?;
    let request: DeployRequest = serde_json::from_slice(&body).map_err(|error| {
        ApiError::bad_request(format!(
            "the body must be {{\"version\": \"…\", \"as\": \"active\"|\"shadow\"}}: {error}"
        ))
    })?;
    let answer = node.plugin_registry().deploy(&name, &request.version, request.role, &admin.key_id).await?;
    Ok(Json(answer))
}

/// `POST /admin/plugins/{name}/rollback`: the previous active version back on every node.
pub async fn rollback(
    State(node): State<Arc<Node>>,
    admin: Admin,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_params(name)?;
    Ok(Json(node.plugin_registry().rollback(&name, &admin.key_id, None).await?))
}

/// `GET /admin/plugins/{name}/history`: the audit trail, oldest first.
pub async fn history(
    State(node): State<Arc<Node>>,
    _admin: Admin,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_params(name)?;
    let history = node.plugin_registry().history(&name).await?;
    Ok(Json(json!({ "plugin": name, "history": history })))
}
