//! The hook calls the pipeline makes: each runs the hook's chain of plugins in configured
//! order and combines their answers; a failed or quarantined plugin is answered for by its
//! failure policy; with no plugin, the built-in default decides.
//!
//! | hook | combination |
//! |---|---|
//! | message-policy | first `reject` wins; `rewrite` feeds the next plugin the new body |
//! | announce-policy | first `defer`/`duplicate` wins; archived only if every plugin says so |
//! | route-key | first `Some` wins; none → built-in default |
//! | degrade | the most degraded tier |
//! | connect | first `deny` wins; the first user-id override applies |
//! | deliver-filter | a recipient any plugin drops is dropped |

use crate::{
    call::{Failure, Input, Output},
    config::{FailurePolicy, Hook},
    host::PluginHost,
    plugin::Plugin,
    types::{
        Acceptance, AnnounceDecision, Announcement, ConnectDecision, ConnectRequest, Delivery, Health, Message,
        MessageDecision, Rejection, RouteRequest, Tier,
    },
};
use std::{borrow::Cow, collections::HashSet, sync::Arc};

/// How long a `deny` failure policy defers an announcement, ms.
const DENY_DEFER_MS: u64 = 1_000;

fn severity(tier: Tier) -> u8 {
    match tier {
        Tier::Normal => 0,
        Tier::OfflineOnly => 1,
        Tier::NoBackfill => 2,
        Tier::PullOnly => 3,
    }
}

impl PluginHost {
    /// A snapshot: calls finish on the plugins they started with, whatever reloads happen.
    /// Taken once `hook`'s gate lets calls in (`PluginHost::hold`): while a cluster switches
    /// versions of a plugin with this hook, no call of it starts, and the guard keeps a
    /// started call counted until it is answered, so a hold waits for every call on the old
    /// versions to finish.
    async fn snapshot(&self, hook: Hook) -> (tokio::sync::RwLockReadGuard<'_, ()>, Arc<crate::host::Registry>) {
        let entered = self.inner.gates[hook.index()].read().await;
        (entered, self.inner.registry.load_full())
    }

    /// Calls `plugin`; on failure returns the policy to apply. Its shadow, if it has one,
    /// is then given the same input (queued for the shadow's worker: this call does not
    /// wait).
    async fn call(
        registry: &crate::host::Registry,
        plugin: &Plugin,
        hook: Hook,
        input: Input<'_>,
    ) -> Result<Output, FailurePolicy> {
        let result = plugin.invoke(input).await;
        if let Some(shadow) = registry.shadows.get(&*plugin.name) {
            shadow.offer(hook, input, &result);
        }
        match result {
            Ok(output) => Ok(output),
            Err(Failure { .. }) => Err(plugin.settings.failure(hook)),
        }
    }

    /// Pipeline step 4: allow, reject or rewrite `message`.
    pub async fn message_policy(&self, message: &Message) -> MessageDecision {
        let (_entered, registry) = self.snapshot(Hook::MessagePolicy).await;
        let chain = &registry.chains[Hook::MessagePolicy.index()];
        if chain.is_empty() {
            return self.inner.fallback.message_policy(message);
        }
        let mut current = Cow::Borrowed(message);
        let mut rewritten = false;
        for plugin in chain {
            let decision = match Self::call(&registry, plugin, Hook::MessagePolicy, Input::Message(&current)).await {
                Ok(Output::Message(d)) => d,
                Ok(_) | Err(FailurePolicy::Default) => self.inner.fallback.message_policy(&current),
                Err(FailurePolicy::Allow) => MessageDecision::Allow,
                Err(FailurePolicy::Deny) => MessageDecision::Reject(Rejection {
                    code: "plugin-failed".to_owned(),
                    reason: format!("the message policy `{}` is failing; try again later", plugin.name),
                    retry_after_ms: None,
                }),
            };
            match decision {
                MessageDecision::Allow => {}
                reject @ MessageDecision::Reject(_) => return reject,
                MessageDecision::Rewrite(body) => {
                    current.to_mut().body = body;
                    rewritten = true;
                }
            }
        }
        if rewritten { MessageDecision::Rewrite(current.into_owned().body) } else { MessageDecision::Allow }
    }

    /// Accept (and archive or not), defer or flag as duplicate an announcement.
    pub async fn announce_policy(&self, announcement: &Announcement) -> AnnounceDecision {
        let (_entered, registry) = self.snapshot(Hook::AnnouncePolicy).await;
        let chain = &registry.chains[Hook::AnnouncePolicy.index()];
        if chain.is_empty() {
            return self.inner.fallback.announce_policy(announcement);
        }
        let mut archive = true;
        for plugin in chain {
            let decision =
                match Self::call(&registry, plugin, Hook::AnnouncePolicy, Input::Announcement(announcement)).await {
                    Ok(Output::Announcement(d)) => d,
                    Ok(_) | Err(FailurePolicy::Default) => self.inner.fallback.announce_policy(announcement),
                    Err(FailurePolicy::Allow) => AnnounceDecision::Accept(Acceptance { archive: true }),
                    Err(FailurePolicy::Deny) => AnnounceDecision::Defer(DENY_DEFER_MS),
                };
            match decision {
                AnnounceDecision::Accept(a) => archive &= a.archive,
                other => return other,
            }
        }
        AnnounceDecision::Accept(Acceptance { archive })
    }

    /// The key the ring hashes for `request`.
    pub async fn route_key(&self, request: &RouteRequest) -> String {
        let (_entered, registry) = self.snapshot(Hook::RouteKey).await;
        for plugin in &registry.chains[Hook::RouteKey.index()] {
            // `allow` and `deny` mean nothing for a key: a failure falls through to the
            // next plugin and, in the end, the built-in default.
            if let Ok(Output::Route(Some(key))) =
                Self::call(&registry, plugin, Hook::RouteKey, Input::Route(request)).await
            {
                return key;
            }
        }
        self.inner.fallback.route_key(request)
    }

    /// The delivery tier for `health`.
    pub async fn degrade(&self, health: &Health) -> Tier {
        let (_entered, registry) = self.snapshot(Hook::Degrade).await;
        let chain = &registry.chains[Hook::Degrade.index()];
        if chain.is_empty() {
            return self.inner.fallback.degrade(health);
        }
        let mut worst = Tier::Normal;
        for plugin in chain {
            let tier = match Self::call(&registry, plugin, Hook::Degrade, Input::Health(health)).await {
                Ok(Output::Tier(t)) => t,
                Ok(_) | Err(FailurePolicy::Default) => self.inner.fallback.degrade(health),
                Err(FailurePolicy::Allow) => Tier::Normal,
                Err(FailurePolicy::Deny) => Tier::PullOnly,
            };
            if severity(tier) > severity(worst) {
                worst = tier;
            }
        }
        worst
    }

    /// Authorize a connection whose token is valid.
    pub async fn connect(&self, request: &ConnectRequest) -> ConnectDecision {
        let (_entered, registry) = self.snapshot(Hook::Connect).await;
        let chain = &registry.chains[Hook::Connect.index()];
        if chain.is_empty() {
            return self.inner.fallback.connect(request);
        }
        let mut user_id = None;
        for plugin in chain {
            let decision = match Self::call(&registry, plugin, Hook::Connect, Input::Connect(request)).await {
                Ok(Output::Connect(d)) => d,
                Ok(_) | Err(FailurePolicy::Default) => self.inner.fallback.connect(request),
                Err(FailurePolicy::Allow) => ConnectDecision::Allow(None),
                Err(FailurePolicy::Deny) => {
                    ConnectDecision::Deny(format!("the connect policy `{}` is failing; try again later", plugin.name))
                }
            };
            match decision {
                ConnectDecision::Allow(id) => user_id = user_id.or(id),
                deny @ ConnectDecision::Deny(_) => return deny,
            }
        }
        ConnectDecision::Allow(user_id)
    }

    /// The recipients of `delivery` who must not get it: those any plugin drops (only ids
    /// among `delivery.recipients` count). Without a plugin, none. A failing plugin drops
    /// none under `allow` or `default`, and all under `deny`.
    pub async fn deliver_filter(&self, delivery: &Delivery) -> HashSet<String> {
        let (_entered, registry) = self.snapshot(Hook::DeliverFilter).await;
        let mut dropped = HashSet::new();
        for plugin in &registry.chains[Hook::DeliverFilter.index()] {
            match Self::call(&registry, plugin, Hook::DeliverFilter, Input::Delivery(delivery)).await {
                Ok(Output::Dropped(ids)) => dropped.extend(ids),
                Ok(_) | Err(FailurePolicy::Allow | FailurePolicy::Default) => {}
                Err(FailurePolicy::Deny) => return delivery.recipients.iter().cloned().collect(),
            }
        }
        if !dropped.is_empty() {
            let recipients: HashSet<&String> = delivery.recipients.iter().collect();
            dropped.retain(|id| recipients.contains(id));
        }
        dropped
    }
}
