//! The sample call of each hook: what `herald plugin check` shows, what an upload to the
//! plugin registry must pass, and how a node warms a version the registry deploys. Apart
//! from `check.rs` because both the checks and the host (`host/deployed.rs`) run it.

use crate::{
    call::{Input, Output},
    config::Hook,
    plugin::Plugin,
    types::{Announcement, CommandKind, ConnectRequest, Delivery, Health, Message, RouteRequest},
};
use serde::Serialize;

/// One hook run on sample input.
#[derive(Debug, Clone, Serialize)]
pub struct SampleRun {
    /// The hook.
    pub hook: Hook,
    /// The input, as debug text.
    pub input: String,
    /// The decision (debug text), or why the call failed.
    pub outcome: Result<String, String>,
}

fn sample_message() -> Message {
    Message {
        sender: "alice".into(),
        sender_device: "phone".into(),
        conversation: "room:lobby".into(),
        kind: 1,
        body: b"hello".to_vec(),
        client_msg_id: "00000000-0000-4000-8000-000000000001".into(),
    }
}

/// Runs each hook `plugin` exports once on sample input: what `herald plugin check` shows,
/// what an upload to the registry must pass, and how a node warms a deployed version.
pub(crate) async fn run_samples(plugin: &Plugin) -> Vec<SampleRun> {
    let message = sample_message();
    let announcement = Announcement {
        room: "room:lobby".into(),
        announcement_id: Some("check-1".into()),
        sender: Some("game-server".into()),
        content: "Server restarts in 5 minutes".into(),
    };
    let route =
        RouteRequest { command: CommandKind::Send, user: "alice".into(), conversation: Some("room:lobby".into()) };
    let health = Health {
        connections: 1_000,
        send_queue_depth_p99: 2,
        send_queue_depth_max: 10,
        store_latency_p99_ms: 5,
        redelivery_ratio: 0.01,
        cpu_load: 0.3,
        errors_per_second: 0.0,
    };
    let connect =
        ConnectRequest { user: "alice".into(), device: "phone".into(), claims: vec![("sub".into(), "alice".into())] };
    let delivery = Delivery {
        conversation: "room:lobby".into(),
        seq: 42,
        sender: "alice".into(),
        kind: 1,
        body: b"hello".to_vec(),
        recipients: vec!["bob".into(), "carol".into()],
    };
    let mut samples = Vec::new();
    for hook in plugin.hooks.clone() {
        let (input, text) = match hook {
            Hook::MessagePolicy => (Input::Message(&message), format!("{message:?}")),
            Hook::AnnouncePolicy => (Input::Announcement(&announcement), format!("{announcement:?}")),
            Hook::RouteKey => (Input::Route(&route), format!("{route:?}")),
            Hook::Degrade => (Input::Health(&health), format!("{health:?}")),
            Hook::Connect => (Input::Connect(&connect), format!("{connect:?}")),
            Hook::DeliverFilter => (Input::Delivery(&delivery), format!("{delivery:?}")),
        };
        let outcome = match plugin.invoke(input).await {
            Ok(Output::Message(d)) => Ok(format!("{d:?}")),
            Ok(Output::Announcement(d)) => Ok(format!("{d:?}")),
            Ok(Output::Route(d)) => Ok(format!("{d:?}")),
            Ok(Output::Tier(d)) => Ok(format!("{d:?}")),
            Ok(Output::Connect(d)) => Ok(format!("{d:?}")),
            Ok(Output::Dropped(d)) => Ok(format!("drop {d:?}")),
            Err(f) => Err(f.message),
        };
        samples.push(SampleRun { hook, input: text, outcome });
    }
    samples
}
