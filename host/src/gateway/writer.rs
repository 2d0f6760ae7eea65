//! The writer side of a connection: the only task that writes to its socket. Frames queued
//! together are written together, with one flush.

use std::sync::Arc;
use tokio::time::Instant;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures_util::SinkExt;
use futures_util::stream::SplitSink;
use herald_proto::v1::{self, Frame};
use herald_proto::{Encoding, encode_frame};

use super::connection::{CloseReason, Connection, Outgoing};
use super::heartbeat::Heartbeat;
use crate::clock::WallClock;

/// Writes queued frames, pings as `heartbeat` says, and finally the close frame.
pub(super) async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    connection: Arc<Connection>,
    mut heartbeat: Heartbeat,
    encoding: Encoding,
    clock: Arc<dyn WallClock>,
) {
    /// Tells the connection its writer stopped, however the loop ends.
    struct Stopped<'a>(&'a Connection);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.writer_stopped();
        }
    }
    let _stopped = Stopped(&connection);
    // One timer for the connection's life, moved rather than made anew: a ping is due at
    // the earliest when the last write is a heartbeat old, so a busy connection's writes
    // cost the timer nothing, and it fires at most once a heartbeat.
    let ping = tokio::time::sleep_until(heartbeat.next(connection.heard_at()));
    tokio::pin!(ping);
    loop {
        if let Some((why, farewell)) = connection.close_request() {
            if let Some(message) = farewell.and_then(|frame| to_message(&Outgoing::Own(frame), encoding)) {
                let _ = sink.send(message).await;
            }
            let _ = sink.send(close_message(&why)).await;
            let _ = sink.close().await;
            return;
        }
        let written = match write_queued(&mut sink, &connection, encoding).await {
            // Nothing queued: wait for a frame, a close, or the next ping.
            Ok(0) => tokio::select! {
                biased;
                () = connection.work() => Ok(()),
                () = &mut ping => {
                    let (now, heard_at) = (Instant::now(), connection.heard_at());
                    let sent = match heartbeat.due(now, heard_at) {
                        Some(due) => {
                            let frame = Frame::new(0, v1::Ping { time_ms: clock.now_ms(), reply: due.reply });
                            match to_message(&Outgoing::Own(Box::new(frame)), encoding) {
                                Some(message) => sink.send(message).await,
                                None => Ok(()),
                            }
                        }
                        None => Ok(()),
                    };
                    ping.as_mut().reset(heartbeat.next(heard_at));
                    sent
                }
            },
            Ok(_) => {
                heartbeat.wrote(Instant::now());
                Ok(())
            }
            Err(error) => Err(error),
        };
        if written.is_err() {
            connection.close(CloseReason::normal());
            return;
        }
    }
}

/// Writes whatever is queued by now (at most [`MAX_FRAMES_PER_FLUSH`]) with one flush: one
/// write to the socket, not one per frame. Returns how many frames it took; a close
/// requested meanwhile is seen before the next batch.
async fn write_queued(
    sink: &mut SplitSink<WebSocket, Message>,
    connection: &Connection,
    encoding: Encoding,
) -> Result<usize, axum::Error> {
    let mut batch = 0;
    while batch < MAX_FRAMES_PER_FLUSH
        && let Some(frame) = connection.pop()
    {
        batch += 1;
        if let Some(message) = to_message(&frame, encoding) {
            sink.feed(message).await?;
        }
    }
    if batch > 0 {
        sink.flush().await?;
    }
    Ok(batch)
}

/// Most frames written before one flush: bounds how long the first waits.
const MAX_FRAMES_PER_FLUSH: usize = 64;

/// `outgoing` as a WebSocket message in the connection's encoding (`None`, logged, if it
/// cannot be encoded). A shared frame is encoded by the first writer that needs it.
fn to_message(outgoing: &Outgoing, encoding: Encoding) -> Option<Message> {
    let encoded = match outgoing {
        Outgoing::Own(frame) => encode_frame(frame, encoding).map(Bytes::from),
        Outgoing::Shared(frame) => frame.encoded(encoding),
    };
    match encoded {
        Ok(bytes) if encoding == Encoding::Json => Utf8Bytes::try_from(bytes).ok().map(Message::Text),
        Ok(bytes) => Some(Message::Binary(bytes)),
        Err(error) => {
            tracing::error!(%error, "a frame could not be encoded");
            None
        }
    }
}

/// Closes a connection that never became a client (a refused handshake).
pub(super) async fn close_now(sink: &mut SplitSink<WebSocket, Message>, why: CloseReason) {
    let _ = sink.send(close_message(&why)).await;
    let _ = sink.close().await;
}

/// A close frame; the reason is cut to fit a control frame (125 bytes, 2 of them the code).
fn close_message(why: &CloseReason) -> Message {
    let mut end = why.reason.len().min(123);
    while !why.reason.is_char_boundary(end) {
        end -= 1;
    }
    Message::Close(Some(CloseFrame { code: why.code, reason: why.reason[..end].into() }))
}
