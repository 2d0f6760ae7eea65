//! The HTTP API (axum), PROTOCOL.md's HTTP table: dev tokens, groups, history, presence,
//! health, and the WebSocket endpoint. In dev mode `/` serves the web chat page.
//!
//! Errors are always `{"error": {"code": "...", "message": "..."}}` with a fitting status.

mod admin;
mod conversations;
mod groups;
mod registry;
mod rooms;
mod users;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde_json::json;

use crate::model::UserId;
use crate::node::Node;

/// The dev-mode API key and admin key (PROTOCOL.md, "Dev mode").
const DEV_KEY: &str = "dev-key";

/// The web chat page served at `/` in dev mode: examples/web bundled by the scripts, or a
/// page saying how to build it (build.rs picks which).
const WEB_PAGE: &str = include_str!(env!("WEB_CHAT_PAGE_FILE"));

/// An HTTP error in PROTOCOL.md's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable, machine-readable code such as `not_found`.
    pub code: &'static str,
    /// What happened and what to do, for a person.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A body or query the extractor refused: `413 too_large` for a body over
    /// `api.max_body_bytes`, else `400 invalid` with the parser's words.
    pub fn rejected(status: StatusCode, words: String) -> Self {
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(status, "too_large", "the request body is larger than api.max_body_bytes")
        } else {
            Self::bad_request(words)
        }
    }

    pub fn unavailable(error: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("storage unavailable: {error}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}

/// The admin key's id in the audit trail: a digest of the key, never the key.
pub(super) fn key_id(headers: &HeaderMap) -> String {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(bearer(headers).unwrap_or_default().as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("key:{hex}")
}

/// Every route this node serves. Probes (`/healthz`, `/readyz`, `/metrics`) and `/v1/ws`
/// (which has its own connection caps) are outside the per-address HTTP limit.
pub fn router(node: Arc<Node>) -> Router {
    let mut limited = Router::new()
        .route("/v1/dev/token", post(users::dev_token))
        .route("/v1/users/{user}/presence", get(users::presence))
        .route("/v1/groups", post(groups::create))
        .route("/v1/groups/{id}/members/{user}", put(groups::add_member).delete(groups::remove_member))
        .route("/v1/conversations/{conversation}/messages", get(conversations::messages))
        .route("/v1/rooms/{name}/announcements", post(rooms::announce))
        .route("/admin", get(admin::page))
        .route("/admin/plugins", get(admin::plugins))
        .route("/admin/health", get(admin::health))
        .route("/admin/cluster", get(admin::cluster))
        .route("/admin/series", get(admin::series))
        .route("/admin/route", get(admin::route))
        .route("/admin/plugins/reload", post(admin::reload))
        .route("/admin/plugins/{name}/recording", post(admin::start_recording).delete(admin::stop_recording))
        .route("/admin/plugins/{name}/history", get(registry::history))
        .route("/admin/plugins/{name}/shadow", axum::routing::delete(admin::discard_shadow));
    if node.config().dev {
        limited = limited.route("/", get(|| async { Html(WEB_PAGE) }));
    }
    let limited = limited
        .route_layer(middleware::from_fn_with_state(Arc::clone(&node), limit_http))
        .layer(DefaultBodyLimit::max(node.config().api.max_body_bytes));
    // Uploads and deploys: their own body limit, and no request timeout (a deploy waits
    // for every node, bounded by plugin_registry.deploy_timeout_ms).
    let registry = Router::new()
        .route("/admin/plugins/{name}/versions/{version}", put(registry::upload))
        .route("/admin/plugins/{name}/deploy", post(registry::deploy))
        .route("/admin/plugins/{name}/rollback", post(registry::rollback))
        .route("/admin/plugins/{name}/promote", post(admin::promote))
        .layer(DefaultBodyLimit::max(node.config().plugin_registry.max_component_bytes));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/ws", get(crate::gateway::upgrade).with_state(node.gateway()))
        .merge(limited)
        .merge(registry)
        .fallback(not_found)
        .with_state(node)
}

/// `intake.http_requests_per_ip`: 429 with `Retry-After` over the client address's rate.
/// A request whose address is unknown (the server was not given addresses) passes. A
/// request that takes longer than `api.request_timeout_ms` (a body trickled in, say) is
/// answered `408 timeout`.
async fn limit_http(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(Extension(ConnectInfo(addr))) = peer
        && let Err(refused) = node.admit_http(addr.ip())
    {
        return refused.into_response();
    }
    let timeout = std::time::Duration::from_millis(node.config().api.request_timeout_ms);
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!("the request did not complete within {} ms", timeout.as_millis()),
        )
        .into_response(),
    }
}

/// A path's parameters; axum's own refusal (a parameter that is not valid UTF-8 once
/// percent-decoded) is plain text, so it is answered here as `400 invalid` in PROTOCOL.md's
/// shape.
fn path_params<T>(path: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    path.map(|Path(params)| params).map_err(|rejection| ApiError::rejected(rejection.status(), rejection.body_text()))
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ").map(str::trim)
}

/// Checks the bearer key against `keys` (dev mode also takes `dev-key`); `what` names the
/// kind of key in the error. Every key is compared in constant time, and all of them
/// always: how long the answer takes does not tell how much of a guess was right.
fn require_key(node: &Node, headers: &HeaderMap, keys: &[String], what: &str) -> Result<(), ApiError> {
    let key = bearer(headers).ok_or_else(|| {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", format!("send Authorization: Bearer <{what}>"))
    })?;
    let dev_key = if node.config().dev { Some(DEV_KEY) } else { None };
    let known = keys.iter().map(String::as_str).chain(dev_key).fold(subtle::Choice::from(0), |known, candidate| {
        known | subtle::ConstantTimeEq::ct_eq(candidate.as_bytes(), key.as_bytes())
    });
    if bool::from(known) {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", format!("unknown {what}")))
    }
}

/// Checks a server-to-server API key.
fn require_api_key(node: &Node, headers: &HeaderMap) -> Result<(), ApiError> {
    require_key(node, headers, &node.config().api.keys, "api key")
}

/// The user a request's token belongs to.
fn require_user(node: &Node, headers: &HeaderMap) -> Result<UserId, ApiError> {
    let token = bearer(headers)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "send Authorization: Bearer <token>"))?;
    node.authenticate(token).map_err(|error| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", error.to_string()))
}

/// Liveness: the process is up and answering.
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: not draining, the lease held and Redis reachable (cluster mode), and the
/// database answers.
async fn readyz(State(node): State<Arc<Node>>) -> Result<Json<serde_json::Value>, ApiError> {
    if node.is_draining() {
        Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "draining", "the server is shutting down"))
    } else if !node.holds_lease() {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "fenced",
            "this node's cluster lease may have lapsed (Redis unreachable?); it does not act for its conversations",
        ))
    } else if !node.redis_available() {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "redis_unavailable",
            "this node cannot reach Redis (its circuit breaker is open): it serves its open connections from what it \
             knows, while routes, dedup marks and plugin state wait for Redis",
        ))
    } else if node.storage_ready().await {
        Ok(Json(json!({ "status": "ready" })))
    } else {
        Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "the database is not answering"))
    }
}

/// `GET /metrics`: Prometheus text format. Counts the node keeps anyway are copied in as
/// they stand now rather than recorded twice: pushes and redeliveries (its vitals), and each
/// plugin's calls, failures, timeouts and call p99 (the runtime's, for `/admin/plugins`).
async fn metrics(State(node): State<Arc<Node>>) -> impl axum::response::IntoResponse {
    let vitals = node.vitals();
    metrics::counter!("herald_delivery_pushes_total").absolute(vitals.pushes.load(Ordering::Relaxed));
    metrics::counter!("herald_delivery_redeliveries_total").absolute(vitals.redeliveries.load(Ordering::Relaxed));
    for plugin in node.plugins().status() {
        let name = plugin.name;
        metrics::counter!("herald_plugin_calls_total", "plugin" => name.clone()).absolute(plugin.calls);
        metrics::counter!("herald_plugin_failures_total", "plugin" => name.clone()).absolute(plugin.failures);
        metrics::counter!("herald_plugin_timeouts_total", "plugin" => name.clone()).absolute(plugin.timeouts);
        if let Some(p99_us) = plugin.p99_call_us {
            metrics::gauge!("herald_plugin_call_p99_seconds", "plugin" => name).set(p99_us as f64 / 1e6);
        }
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::telemetry::render())
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}
