//! What the HTTP API and the server ask of a running node. Each method says what the
//! caller wants; the parts that answer it (gateway, membership, delivery, pipeline,
//! router, plugins) stay the node's own, so neither caller depends on how it is wired.

use std::net::IpAddr;
use std::sync::Arc;

use super::{ClusterStatus, Node};
use crate::config::Config;
use crate::delivery::pull::{Page, PullError, Span};
use crate::gateway::Gateway;
use crate::gateway::auth::AuthError;
use crate::gateway::homes::PlacementStatus;
use crate::gateway::intake::Refused;
use crate::health::Vitals;
use crate::membership::GroupChange;
use crate::model::{ConversationId, GroupId, UserId};
use crate::pipeline::SendError;
use crate::pipeline::announce::Announced;
use crate::plugins::PluginHost;
use crate::plugins::types::CommandKind;
use crate::routing::router::Routed;
use crate::routing::topology::RingView;
use crate::routing::{Route, RouteError};
use crate::store::StoreError;

/// Where a user is connected, as `GET /v1/users/{user}/presence` shows it.
pub struct Presence {
    /// The devices online: connected now, not parked for a reconnect.
    pub devices: Vec<Route>,
    /// Now while a device is online, else when the last one left (`None` when none left
    /// within [`LAST_SEEN_KEPT`](crate::routing::LAST_SEEN_KEPT)).
    pub last_seen_ms: Option<u64>,
}

impl Node {
    /// The settings this node was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The WebSocket edge, to mount at `/v1/ws`.
    pub fn gateway(&self) -> Arc<Gateway> {
        Arc::clone(&self.gateway)
    }

    /// Wall time, in ms since the Unix epoch, from the node's clock.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The user a bearer token was issued to, checked as the gateway checks a `connect`.
    ///
    /// # Errors
    /// [`AuthError`] when the token is not valid here.
    pub fn authenticate(&self, token: &str) -> Result<UserId, AuthError> {
        self.gateway.authenticate(token)
    }

    /// A token for `user`, valid for `ttl_secs` from now.
    ///
    /// # Errors
    /// [`AuthError`] when this node cannot sign tokens.
    pub fn issue_token(&self, user: &UserId, ttl_secs: u64) -> Result<String, AuthError> {
        self.gateway.issue_token(user, ttl_secs)
    }

    /// Whether an HTTP request from `client` is within `intake.http_requests_per_ip`.
    ///
    /// # Errors
    /// [`Refused`] when it is not; answer it as is.
    pub fn admit_http(&self, client: IpAddr) -> Result<(), Refused> {
        self.gateway.admit_http(client)
    }

    /// Where `user`'s devices are connected, and when the user was last seen.
    ///
    /// # Errors
    /// [`RouteError`] when the route table cannot be read.
    pub async fn presence(&self, user: &UserId) -> Result<Presence, RouteError> {
        let mut routes = self.routes.devices_of(std::slice::from_ref(user)).await?;
        let devices: Vec<Route> = routes.remove(user).unwrap_or_default().into_iter().filter(|r| !r.parked).collect();
        let last_seen_ms = if devices.is_empty() { self.routes.last_left(user).await? } else { Some(self.now_ms()) };
        Ok(Presence { devices, last_seen_ms })
    }

    /// Creates `group` with `members`.
    ///
    /// # Errors
    /// [`GroupChange`] saying why it was not created.
    pub async fn create_group(&self, group: &GroupId, members: &[UserId]) -> Result<(), GroupChange> {
        self.membership.create_group(group, members, self.now_ms()).await
    }

    /// Adds `user` to `group`.
    ///
    /// # Errors
    /// [`GroupChange`] saying why not.
    pub async fn add_member(&self, group: &GroupId, user: &UserId) -> Result<(), GroupChange> {
        self.membership.add_member(group, user, self.now_ms()).await
    }

    /// Removes `user` from `group`.
    ///
    /// # Errors
    /// [`GroupChange`] saying why not (not a member, among others).
    pub async fn remove_member(&self, group: &GroupId, user: &UserId) -> Result<(), GroupChange> {
        self.membership.remove_member(group, user).await
    }

    /// A page of `conversation`'s history for `user`, as the `history` frame reads it.
    ///
    /// # Errors
    /// [`PullError`] when `user` may not read it, the request is out of bounds, or storage
    /// fails.
    pub async fn history(
        &self,
        user: &UserId,
        conversation: ConversationId,
        from: Span,
        limit: u32,
    ) -> Result<Page, PullError> {
        self.delivery.page(user, conversation, from, limit).await
    }

    /// Stores an accepted announcement in `room`, or pushes it only ([`Pipeline::announce`]).
    ///
    /// # Errors
    /// [`SendError`] saying why nothing was stored.
    ///
    /// [`Pipeline::announce`]: crate::pipeline::Pipeline::announce
    pub async fn announce(
        &self,
        room: &ConversationId,
        sender: &UserId,
        announcement_id: Option<&str>,
        body: Vec<u8>,
        archive: bool,
    ) -> Result<Announced, SendError> {
        self.pipeline.announce(room, sender, announcement_id, body, archive).await
    }

    /// The ids an archived announcement was stored with, if it was.
    ///
    /// # Errors
    /// [`StoreError`] when storage cannot be read.
    pub async fn announcement_original(
        &self,
        room: &ConversationId,
        sender: &UserId,
        announcement_id: &str,
    ) -> Result<Option<Announced>, StoreError> {
        self.pipeline.announcement_original(room, sender, announcement_id).await
    }

    /// The plugins: their hooks, status, reloads, recordings and shadows.
    pub fn plugins(&self) -> &PluginHost {
        &self.plugins.host
    }

    /// Uploads and deploys through the plugin registry.
    pub fn plugin_registry(&self) -> &Arc<crate::plugins::Deployer> {
        &self.plugins.deployer
    }

    /// Health counters, the last health sample and the delivery tier.
    pub fn vitals(&self) -> &Vitals {
        &self.vitals
    }

    /// The ring as this node sees it now.
    pub fn ring(&self) -> Arc<RingView> {
        self.router.topology().view()
    }

    /// The routing key `command` gets and the node owning it.
    pub async fn route(&self, command: CommandKind, user: &UserId, conversation: Option<&ConversationId>) -> Routed {
        self.router.route(command, user, conversation).await
    }

    /// `user`'s home node under `cluster.placement`.
    pub fn home(&self, user: &UserId) -> Routed {
        self.router.home(user)
    }

    /// Connections away from their home node and requests from a stale nginx.
    pub fn placement(&self) -> Option<PlacementStatus> {
        self.gateway.placement()
    }

    /// Cluster mode: the live members, this node's lease and its circuit breakers; `None`
    /// in embedded mode.
    pub fn cluster_status(&self) -> Option<ClusterStatus> {
        self.cluster.as_ref().map(|cluster| cluster.status())
    }

    /// What accepts TLS on the client listener; `None` when `[tls]` is off.
    pub fn tls_acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        self.tls.as_ref().map(|tls| tls.acceptor().clone())
    }
}
