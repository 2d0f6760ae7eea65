//! Conveniences on the generated [`Frame`]: building one from any body type, and naming
//! a body for logs and error messages.

use crate::v1::{
    Connect, Connected, Deliver, DeliverAck, Error, Frame, GoAway, History, HistoryReply, Ping, Pong, Send, SendAck,
    Subscribe, Subscribed, Sync, SyncHint, SyncReply, Unsubscribe, frame::Body,
};

impl Frame {
    /// A frame with request id `rid` (0 for server-initiated frames) and `body`.
    ///
    /// `body` is any body message (`v1::Send`, `v1::Ping`, …) or a [`Body`] itself.
    pub fn new(rid: u32, body: impl Into<Body>) -> Self {
        Self { rid, body: Some(body.into()) }
    }
}

macro_rules! bodies {
    ($($variant:ident($message:ident) = $name:literal,)*) => {
        impl Body {
            /// The body's name as `PROTOCOL.md` spells it (`"send_ack"`), for logs and for
            /// errors such as "expected connect, got send".
            pub fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $name,)*
                }
            }
        }

        $(
            impl From<$message> for Body {
                fn from(body: $message) -> Self {
                    Self::$variant(body)
                }
            }
        )*
    };
}

bodies! {
    Connect(Connect) = "connect",
    Connected(Connected) = "connected",
    Send(Send) = "send",
    SendAck(SendAck) = "send_ack",
    Deliver(Deliver) = "deliver",
    DeliverAck(DeliverAck) = "deliver_ack",
    Sync(Sync) = "sync",
    SyncReply(SyncReply) = "sync_reply",
    History(History) = "history",
    HistoryReply(HistoryReply) = "history_reply",
    Subscribe(Subscribe) = "subscribe",
    Unsubscribe(Unsubscribe) = "unsubscribe",
    Subscribed(Subscribed) = "subscribed",
    SyncHint(SyncHint) = "sync_hint",
    Ping(Ping) = "ping",
    Pong(Pong) = "pong",
    GoAway(GoAway) = "go_away",
    Error(Error) = "error",
}
