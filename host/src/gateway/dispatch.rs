//! The reader side of a connection: decoding frames and handing each to its part.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::SplitStream;
use herald_proto::v1::{self, Frame, frame::Body};
use herald_proto::{DecodeLimits, Encoding, decode_frame};

use super::connection::{CloseReason, Connection, close};
use super::intake::{FrameBudget, InFlight, Refused};
use super::{Client, Gateway};
use crate::delivery::pull::PullError;
use crate::model::ConversationId;
use crate::telemetry::registered;

use crate::pipeline::Admission;
use crate::routing::bus::{Origin, SendAck, SendRequest};

/// Reads and dispatches frames until the connection should close; returns why.
pub(super) async fn read_loop(
    gateway: &Arc<Gateway>,
    client: &Client,
    stream: &mut SplitStream<WebSocket>,
    limits: &DecodeLimits,
    budget: &FrameBudget,
) -> CloseReason {
    let silence = Duration::from_millis(gateway.config.client_timeout_ms);
    loop {
        let frame = tokio::select! {
            next = tokio::time::timeout(silence, next_frame(stream, limits, budget)) => match next {
                Err(_) => return CloseReason::new(close::NORMAL, format!("no traffic for {} ms", silence.as_millis())),
                Ok(Ok(frame)) => {
                    client.connection.heard();
                    frame
                }
                Ok(Err(Some(why))) => return why,
                Ok(Err(None)) => return CloseReason::normal(),
            },
            () = client.connection.closing() => return CloseReason::normal(),
        };
        // Boxed: a frame's handling is the deepest future of the loop, and inline it would
        // size every idle connection's task for it (docs/ARCHITECTURE.md, "memory per
        // connection").
        if let Err(why) = Box::pin(dispatch(gateway, client, frame)).await {
            return why;
        }
    }
}

/// Reads the next frame: `Err(None)` when the peer went away, `Err(Some(close))` for a
/// frame that must close the connection — one over the connection's `budget` among them.
/// Binary messages are protobuf and text messages JSON, whichever subprotocol was chosen.
pub(super) async fn next_frame(
    stream: &mut SplitStream<WebSocket>,
    limits: &DecodeLimits,
    budget: &FrameBudget,
) -> Result<Frame, Option<CloseReason>> {
    loop {
        let message = stream.next().await;
        if message.is_some() && !budget.take() {
            return Err(Some(CloseReason::new(
                close::TOO_MANY_FRAMES,
                format!("more than {} frames per second", budget.rate),
            )));
        }
        let message = match message {
            None => return Err(None),
            Some(Ok(message)) => message,
            Some(Err(error)) => {
                return Err(over_capacity(error).then(|| {
                    CloseReason::new(close::TOO_BIG, format!("frame larger than {} bytes", limits.max_frame_bytes))
                }));
            }
        };
        let (bytes, encoding) = match message {
            Message::Binary(bytes) => (bytes, Encoding::Proto),
            Message::Text(text) => (Bytes::copy_from_slice(text.as_str().as_bytes()), Encoding::Json),
            Message::Ping(_) | Message::Pong(_) => continue,
            Message::Close(_) => return Err(None),
        };
        return decode_frame(bytes, encoding, limits)
            .map_err(|error| Some(CloseReason::new(error.close_code(), error.to_string())));
    }
}

/// Whether a read failed because a message or frame was over the configured size (as
/// opposed to the peer going away).
fn over_capacity(error: axum::Error) -> bool {
    error
        .into_inner()
        .downcast::<tungstenite::Error>()
        .is_ok_and(|error| matches!(*error, tungstenite::Error::Capacity(_)))
}

fn error_frame(rid: u32, code: &str, message: String) -> Frame {
    Frame::new(rid, v1::Error { code: code.to_owned(), message, rid })
}

fn ack_frame(ack: SendAck) -> Frame {
    Frame::new(ack.rid, ack.ack)
}

/// Queues a `send_ack` for the client; the time since the send was `received` is its
/// send→ack latency (`herald_send_ack_seconds`).
fn answer(connection: &Connection, ack: Frame, received: Instant) {
    connection.push(ack);
    registered!(histogram, "herald_send_ack_seconds").record(received.elapsed().as_secs_f64());
}

/// The `send_ack` RETRY of a send the intake refused: nothing was taken in, the client
/// resends the same `client_msg_id` after `retry_after_ms`.
fn retry_frame(rid: u32, send: v1::Send, refused: &Refused) -> Frame {
    Frame::new(
        rid,
        v1::SendAck {
            client_msg_id: send.client_msg_id,
            status: v1::send_ack::Status::Retry as i32,
            conversation: send.conversation,
            reason: refused.limit.reason().to_owned(),
            retry_after_ms: refused.retry_after_ms(),
            ..v1::SendAck::default()
        },
    )
}

/// Handles one frame from an authenticated client.
async fn dispatch(gateway: &Arc<Gateway>, client: &Client, frame: Frame) -> Result<(), CloseReason> {
    let rid = frame.rid;
    let Some(body) = frame.body else { return Err(CloseReason::new(close::PROTOCOL_ERROR, "frame without a body")) };
    let (connection, session) = (&client.connection, &client.session);
    match body {
        Body::Send(send) => {
            let received = Instant::now();
            let in_flight = match gateway.intake.admit_send(&client.budget, &session.user) {
                Ok(in_flight) => in_flight,
                Err(refused) => {
                    answer(connection, retry_frame(rid, send, &refused), received);
                    return Ok(());
                }
            };
            let origin = Origin {
                user: session.user.clone(),
                device: session.device.clone(),
                node: gateway.this_node(),
                connection: connection.id,
            };
            match gateway.pipeline.admit(SendRequest { origin, rid, send, announcement: false }).await {
                Admission::Done(ack) => answer(connection, ack_frame(ack), received),
                Admission::Wait(rest) => {
                    _ = tokio::spawn(answer_when_settled(Arc::clone(connection), rest, in_flight, received));
                }
            }
        }
        Body::DeliverAck(ack) => match ConversationId::parse(&ack.conversation) {
            Ok(conversation) => gateway.delivery.ack(session, &conversation, ack.seq).await,
            Err(error) => _ = connection.push(error_frame(rid, "invalid", error.to_string())),
        },
        Body::Sync(sync) => {
            let (delivery, session) = (Arc::clone(&gateway.delivery), Arc::clone(session));
            reply_later(connection, rid, async move { delivery.sync(&session, sync).await });
        }
        Body::History(history) => {
            let (delivery, user) = (Arc::clone(&gateway.delivery), session.user.clone());
            reply_later(connection, rid, async move { delivery.history(&user, history).await });
        }
        // In order with the sends that follow: a send right after subscribe must pass.
        Body::Subscribe(subscribe) => {
            let reply = match gateway.delivery.subscribe(session, subscribe).await {
                Ok(reply) => Frame::new(rid, reply),
                Err(error) => error_frame(rid, error.code(), error.to_string()),
            };
            connection.push(reply);
        }
        Body::Unsubscribe(unsubscribe) => {
            if let Err(error) = gateway.delivery.unsubscribe(session, &unsubscribe).await {
                connection.push(error_frame(rid, error.code(), error.to_string()));
            }
        }
        Body::Ping(ping) => _ = connection.push(Frame::new(rid, v1::Pong { time_ms: ping.time_ms })),
        // The answer to our ping echoes its time: one round trip of this connection.
        Body::Pong(pong) => {
            let round_trip =
                gateway.clock.now_ms().checked_sub(pong.time_ms).filter(|&ms| pong.time_ms > 0 && ms < 120_000);
            if let Some(ms) = round_trip {
                session.rtt.sample(Duration::from_millis(ms));
            }
        }
        other => {
            return Err(CloseReason::new(
                close::PROTOCOL_ERROR,
                format!("{} is not a frame a client sends here", other.name()),
            ));
        }
    }
    Ok(())
}

/// Answers a pull request off the reader (reads may take a while): its reply, or an
/// `error` frame saying why not.
fn reply_later<R>(
    connection: &Arc<Connection>,
    rid: u32,
    work: impl Future<Output = Result<R, PullError>> + Send + 'static,
) where
    R: Into<Body> + Send + 'static,
{
    let connection = Arc::clone(connection);
    tokio::spawn(async move {
        let reply = match work.await {
            Ok(reply) => Frame::new(rid, reply),
            Err(error) => error_frame(rid, error.code(), error.to_string()),
        };
        connection.push(reply);
    });
}

/// Writes a queued send's ack once it is settled, then runs its fan-out; the send counts
/// in the node's backlog (`in_flight`) until both are done, and its wait is what the
/// intake's delay gate watches.
async fn answer_when_settled(
    connection: Arc<Connection>,
    rest: std::pin::Pin<Box<dyn Future<Output = crate::pipeline::Settled> + Send>>,
    in_flight: InFlight,
    received: Instant,
) {
    let settled = rest.await;
    in_flight.answered(received.elapsed());
    answer(&connection, ack_frame(settled.ack), received);
    if let Some(fan_out) = settled.fan_out {
        fan_out.await;
    }
}
