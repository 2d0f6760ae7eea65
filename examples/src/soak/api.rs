//! The soak's HTTP side: groups created and changed through the API, announcements posted
//! to the rooms of the moment, and history read over HTTP, as a server-side application
//! would.

use std::{sync::Arc, time::Duration};

use serde_json::json;
use tokio::{sync::watch, time::Instant};

use super::{
    until_stopped,
    world::{Counters, Group, World},
};
use crate::{http, ids::random_tag};

/// Bounds one HTTP call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how the API is called.
#[derive(Debug, Clone)]
pub(super) struct Api {
    /// The server's `host:port`.
    pub authority: String,
    /// The API key (`dev-key` in dev mode).
    pub api_key: String,
}

impl Api {
    async fn call(&self, method: &str, path: &str, bearer: &str, body: Option<&str>) -> Option<http::Response> {
        http::request(&self.authority, method, path, Some(bearer), body, CALL_TIMEOUT).await.ok()
    }
}

/// Every `every`, until `stop`: creates a group of 3–6 current users, adds a user to or
/// removes one from a recent group, and reads a recent group's history over HTTP as one of
/// its members.
pub(super) async fn run_groups(api: Api, world: Arc<World>, every: Duration, mut stop: watch::Receiver<bool>) {
    let counters = &world.counters;
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = until_stopped(&mut stop) => return,
            _ = ticks.tick() => {}
        }
        let id = world.new_group_id();
        let members = world.random_users(rand::random_range(3..=6));
        let body = json!({ "id": id, "members": members }).to_string();
        match api.call("POST", "/v1/groups", &api.api_key, Some(&body)).await {
            Some(response) if response.status == 201 => {
                Counters::bump(&counters.groups);
                world.add_group(Group { id, members });
            }
            _ => Counters::bump(&counters.http_failures),
        }

        let Some(group) = world.random_group() else { continue };
        let remove = group.members.len() > 2 && rand::random_bool(0.5);
        let user = if remove {
            group.members[rand::random_range(0..group.members.len())].clone()
        } else {
            world.random_users(1).pop().unwrap_or_default()
        };
        if !user.is_empty() && (remove || !group.members.contains(&user)) {
            let method = if remove { "DELETE" } else { "PUT" };
            let path = format!("/v1/groups/{}/members/{user}", group.id);
            match api.call(method, &path, &api.api_key, None).await {
                Some(response) if response.status == 204 => {
                    Counters::bump(&counters.member_changes);
                    world.change_member(&group.id, &user, !remove);
                }
                _ => Counters::bump(&counters.http_failures),
            }
        }

        if let Some(member) = group.members.iter().find(|member| **member != user) {
            let path = format!("/v1/conversations/grp:{}/messages?after_seq=0&limit=20", group.id);
            match api.call("GET", &path, &format!("dev:{member}"), None).await {
                Some(response) if response.is_success() => Counters::bump(&counters.pulls),
                _ => Counters::bump(&counters.http_failures),
            }
        }
    }
}

/// Posts about `per_second` announcements to the rooms of the moment until `stop`; one in
/// ten repeats the previous `announcement_id` (the server answers it as a duplicate).
pub(super) async fn run_announcements(
    api: Api,
    world: Arc<World>,
    per_second: f64,
    started: Instant,
    mut stop: watch::Receiver<bool>,
) {
    if per_second <= 0.0 {
        return;
    }
    let counters = &world.counters;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut previous = random_tag(16);
    loop {
        tokio::select! {
            _ = until_stopped(&mut stop) => return,
            _ = ticks.tick() => {}
        }
        let room = world.random_room(started.elapsed());
        if !rand::random_bool(0.1) {
            previous = random_tag(16);
        }
        let body = json!({ "content": "soak announcement", "announcement_id": previous }).to_string();
        let path = format!("/v1/rooms/{room}/announcements");
        match api.call("POST", &path, &api.api_key, Some(&body)).await {
            Some(response) if response.is_success() => Counters::bump(&counters.announced),
            Some(response) if response.status == 429 => Counters::bump(&counters.announce_paced),
            _ => Counters::bump(&counters.http_failures),
        }
    }
}
