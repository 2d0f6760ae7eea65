//! A hook call as the runtime passes it around: its input, its answer, and why it had none.
//! The plugin that answers it, the recording that keeps it and the shadow that repeats it
//! all speak these, so they sit below all three.

use crate::types::{
    AnnounceDecision, Announcement, ConnectDecision, ConnectRequest, Delivery, Health, Message, MessageDecision,
    RouteRequest, Tier,
};

/// A hook call's input.
#[derive(Clone, Copy)]
pub(crate) enum Input<'a> {
    Message(&'a Message),
    Announcement(&'a Announcement),
    Route(&'a RouteRequest),
    Health(&'a Health),
    Connect(&'a ConnectRequest),
    Delivery(&'a Delivery),
}

/// A hook call's answer.
pub(crate) enum Output {
    Message(MessageDecision),
    Announcement(AnnounceDecision),
    Route(Option<String>),
    Tier(Tier),
    Connect(ConnectDecision),
    /// The recipients to drop.
    Dropped(Vec<String>),
}

/// Why a call produced no answer.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub message: String,
}
