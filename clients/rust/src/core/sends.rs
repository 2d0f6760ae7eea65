//! Sends: one call is one stored message. A send stays pending until a final `send_ack`;
//! `RETRY` writes it again after `retry_after_ms` and a lost connection on the next one,
//! always with the same `client_msg_id`, so the server's dedup turns a resend of a stored
//! message into `DUPLICATE`.

use std::time::Duration;

use crate::wire::v1::{self, send_ack::Status};
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Core;
use crate::error::SendError;
use crate::types::{Event, RetryInfo, Sent, State};

pub(crate) struct PendingSend {
    client_msg_id: String,
    conversation: String,
    kind: u32,
    body: Bytes,
    reply: oneshot::Sender<Result<Sent, SendError>>,
    /// Written on the current connection and awaiting its `send_ack`.
    on_wire: bool,
    /// When it was last written (the send window's RETRY rule).
    sent_at: Instant,
    /// After a RETRY: not written again before this time.
    not_before: Option<Instant>,
    /// The caller's timeout.
    pub(super) deadline: Option<Instant>,
}

impl Core {
    pub(super) fn add_send(
        &mut self,
        conversation: String,
        kind: u32,
        body: Bytes,
        client_msg_id: String,
        timeout: Option<Duration>,
        reply: oneshot::Sender<Result<Sent, SendError>>,
    ) {
        if self.is_closed() {
            let why = "the client is closed".to_owned();
            let _ = reply.send(Err(SendError::Abandoned { why, client_msg_id, conversation }));
            return;
        }
        let max = self.options.max_body_bytes;
        if body.len() > max {
            // Written, it would make the server close with 1009, and the resend again.
            let reason = format!("body of {} bytes is over {max} (not sent)", body.len());
            let _ = reply.send(Err(SendError::Rejected { reason, client_msg_id, conversation, retry_after_ms: None }));
            return;
        }
        if self.send_index.contains_key(&client_msg_id) {
            let _ = reply.send(Err(SendError::InProgress(client_msg_id)));
            return;
        }
        let order = self.next_send;
        self.next_send += 1;
        self.send_index.insert(client_msg_id.clone(), order);
        let now = Instant::now();
        let deadline = timeout.map(|timeout| now + timeout);
        let pending = PendingSend {
            client_msg_id,
            conversation,
            kind,
            body,
            reply,
            on_wire: false,
            sent_at: now,
            not_before: None,
            deadline,
        };
        self.sends.insert(order, pending);
        self.pump();
    }

    /// Writes waiting sends in call order, within the send window. A send waiting out a
    /// RETRY holds back those behind it: the server is busy for them too.
    pub(super) fn pump(&mut self) {
        self.pump_at = None;
        if self.state != State::Connected {
            return;
        }
        let now = Instant::now();
        let window = self.window.size();
        let mut frames = Vec::new();
        for pending in self.sends.values_mut() {
            if pending.on_wire {
                continue;
            }
            if self.sends_on_wire >= window {
                break; // the next send_ack pumps again
            }
            if let Some(at) = pending.not_before.filter(|at| *at > now) {
                self.pump_at = Some(at);
                break;
            }
            let wait = self.budget.wait(now);
            if !wait.is_zero() {
                self.pump_at = Some(now + wait);
                break;
            }
            // Counted here, since the frames are queued after the loop.
            self.budget.spend(now);
            pending.on_wire = true;
            pending.sent_at = now;
            pending.not_before = None;
            self.sends_on_wire += 1;
            frames.push(v1::Send {
                client_msg_id: pending.client_msg_id.clone(),
                conversation: pending.conversation.clone(),
                kind: pending.kind,
                body: pending.body.clone(),
            });
        }
        for send in frames {
            let rid = self.rid();
            if self.socket_open {
                self.outbox.push(v1::Frame { rid, body: Some(send.into()) });
            }
        }
    }

    /// A lost connection: every pending send is written again on the next one.
    pub(super) fn unwire_sends(&mut self) {
        for pending in self.sends.values_mut() {
            pending.on_wire = false;
            pending.not_before = None;
        }
        self.sends_on_wire = 0;
        self.pump_at = None;
    }

    fn settle(&mut self, client_msg_id: &str) -> Option<PendingSend> {
        let order = self.send_index.remove(client_msg_id)?;
        let pending = self.sends.remove(&order)?;
        if pending.on_wire {
            self.sends_on_wire = self.sends_on_wire.saturating_sub(1);
        }
        Some(pending)
    }

    pub(super) fn abandon_all_sends(&mut self, why: &str) {
        self.send_index.clear();
        self.sends_on_wire = 0;
        for (_, pending) in std::mem::take(&mut self.sends) {
            let PendingSend { client_msg_id, conversation, reply, .. } = pending;
            let _ = reply.send(Err(SendError::Abandoned { why: why.to_owned(), client_msg_id, conversation }));
        }
    }

    pub(super) fn expire_sends(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .sends
            .values()
            .filter(|pending| pending.deadline.is_some_and(|at| at <= now))
            .map(|pending| pending.client_msg_id.clone())
            .collect();
        for id in &expired {
            if let Some(pending) = self.settle(id) {
                let PendingSend { client_msg_id, conversation, reply, .. } = pending;
                let why = "no final answer within its timeout".to_owned();
                let _ = reply.send(Err(SendError::Abandoned { why, client_msg_id, conversation }));
            }
        }
        if !expired.is_empty() {
            self.pump();
        }
    }

    pub(super) fn on_send_ack(&mut self, ack: v1::SendAck) {
        let Some(order) = self.send_index.get(&ack.client_msg_id).copied() else {
            return;
        };
        let Some(pending) = self.sends.get_mut(&order).filter(|pending| pending.on_wire) else {
            return;
        };
        let conversation =
            if ack.conversation.is_empty() { pending.conversation.clone() } else { ack.conversation.clone() };
        let status = Status::try_from(ack.status).unwrap_or(Status::Unspecified);
        match status {
            Status::Ok | Status::Duplicate => {
                if let Some(pending) = self.settle(&ack.client_msg_id) {
                    self.window.stored();
                    let sent = Sent {
                        message_id: ack.message_id,
                        seq: ack.seq,
                        conversation: conversation.clone(),
                        client_msg_id: ack.client_msg_id,
                        duplicate: status == Status::Duplicate,
                    };
                    let _ = pending.reply.send(Ok(sent));
                }
                // Our own message takes its seq in the conversation; the server does not push it to us.
                self.own_stored(&conversation, ack.seq);
            }
            Status::Retry => {
                // Written again, same client_msg_id, once the wait is over; meanwhile fewer in flight.
                let now = Instant::now();
                pending.on_wire = false;
                pending.not_before = Some(now + Duration::from_millis(u64::from(ack.retry_after_ms)));
                let sent_at = pending.sent_at;
                self.sends_on_wire = self.sends_on_wire.saturating_sub(1);
                self.window.retried(sent_at, now);
                self.emit(Event::Retry(RetryInfo {
                    client_msg_id: ack.client_msg_id,
                    conversation,
                    reason: ack.reason,
                    retry_after_ms: ack.retry_after_ms,
                }));
            }
            Status::Rejected | Status::Unspecified => {
                if let Some(pending) = self.settle(&ack.client_msg_id) {
                    let reason = if status == Status::Rejected {
                        ack.reason
                    } else {
                        format!("unknown status {}: {}", ack.status, ack.reason)
                    };
                    let retry_after_ms = Some(ack.retry_after_ms).filter(|ms| *ms > 0);
                    let error =
                        SendError::Rejected { reason, client_msg_id: ack.client_msg_id, conversation, retry_after_ms };
                    let _ = pending.reply.send(Err(error));
                }
            }
        }
        self.pump();
    }
}
