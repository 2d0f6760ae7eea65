//! The HTTP API (axum). For now: liveness and readiness; the rest of PROTOCOL.md's HTTP
//! table arrives with the messaging and plugin work.
//!
//! Errors are always `{"error": {"code": "...", "message": "..."}}` with a fitting status.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::store::Database;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The database, for readiness.
    pub database: Database,
}

/// An HTTP error in PROTOCOL.md's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable, machine-readable code such as `not_found`.
    pub code: &'static str,
    /// What happened and what to do, for a person.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}

/// Every route this node serves.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// Liveness: the process is up and answering.
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: the database answers.
async fn readyz(State(state): State<ApiState>) -> Result<Json<serde_json::Value>, ApiError> {
    if state.database.ping().await {
        Ok(Json(json!({ "status": "ready" })))
    } else {
        Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "not_ready",
            message: "the database is not answering".into(),
        })
    }
}

async fn not_found() -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, code: "not_found", message: "no such endpoint".into() }
}
