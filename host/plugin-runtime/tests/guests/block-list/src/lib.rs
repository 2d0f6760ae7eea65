//! `block-list`: a `deliver-filter` plugin. Its config names, per user, the senders that
//! user has blocked; a message from a blocked sender is not delivered to that user, by any
//! path. Users listed in `muted_rooms.<room>` get nothing from that room.
//!
//! ```toml
//! [config.blocks]
//! bob = ["alice"]          # bob never gets alice's messages
//! [config.muted_rooms]
//! "room:lobby" = ["dave"]  # dave gets nothing from room:lobby
//! ```
use herald_sdk::{DeliverFilter, config, types::Delivery};
use serde::Deserialize;
use std::collections::HashMap;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Settings {
    blocks: HashMap<String, Vec<String>>,
    muted_rooms: HashMap<String, Vec<String>>,
}

static SETTINGS: config::Cached<Settings> = config::Cached::new();

struct BlockList;

impl DeliverFilter for BlockList {
    fn filter_recipients(delivery: Delivery) -> Vec<String> {
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let muted = settings.muted_rooms.get(&delivery.conversation);
        delivery
            .recipients
            .into_iter()
            .filter(|user| {
                muted.is_some_and(|m| m.contains(user))
                    || settings.blocks.get(user).is_some_and(|blocked| blocked.contains(&delivery.sender))
            })
            .collect()
    }
}

herald_sdk::export_plugin!(BlockList, hooks: [deliver_filter]);
