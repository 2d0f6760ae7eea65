//! What the reconnect benchmarks (`herald-reconnect`, `herald-restart`) share: the set-up
//! that leaves each device with conversations read to the end, so that what comes back to
//! it after a reconnect is only what it lacked.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use herald_proto::v1::{self, Frame, frame::Body};

use crate::connection::Connection;
use crate::ids::{ClientMsgIds, dm_conversation};

/// What a benchmark's device task fails with.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Device `n` of `users` sends one message to each of the next `conversations / 2` users
/// and reads the one each of the previous as many sends it, acking it: every conversation
/// it is in then holds one message, read. A `RETRY` (a busy node) is sent again with the
/// same id after the wait it names; each wait for a frame is bounded by `wait`.
///
/// # Errors
/// A send refused, the connection's, or no frame within `wait`.
pub async fn read_to_the_end(
    connection: &mut Connection,
    users: &[String],
    n: usize,
    conversations: usize,
    wait: Duration,
) -> Result<(), Error> {
    let me = &users[n];
    let half = conversations / 2;
    let mut ids = ClientMsgIds::new();
    // By request id, each send until its final ack.
    let mut unacked = HashMap::new();
    for k in 1..=half {
        let to = &users[(n + k) % users.len()];
        let send = v1::Send {
            client_msg_id: ids.next_id(),
            conversation: dm_conversation(me, to),
            kind: 1,
            body: "read".into(),
        };
        let rid = connection.next_rid();
        connection.feed(&Frame::new(rid, send.clone())).await?;
        unacked.insert(rid, send);
    }
    connection.flush().await?;
    // Distinct conversations: a redelivery of a message not yet acked must not count twice.
    let (mut acks, mut delivered) = (0, HashSet::new());
    while acks < half || delivered.len() < half {
        let frame = tokio::time::timeout(wait, connection.recv()).await??;
        match frame.body {
            Some(Body::SendAck(ack)) if ack.status() == v1::send_ack::Status::Retry => {
                let send = unacked.remove(&frame.rid).ok_or("a RETRY of no send of this device")?;
                tokio::time::sleep(Duration::from_millis(u64::from(ack.retry_after_ms))).await;
                let rid = connection.next_rid();
                connection.send(&Frame::new(rid, send.clone())).await?;
                unacked.insert(rid, send);
            }
            Some(Body::SendAck(ack)) if ack.status() == v1::send_ack::Status::Rejected => {
                return Err(format!("a set-up send was rejected: {ack:?}").into());
            }
            Some(Body::SendAck(_)) => {
                unacked.remove(&frame.rid);
                acks += 1;
            }
            Some(Body::Deliver(deliver)) => {
                let message = deliver.message.ok_or("deliver without a message")?;
                let seq = message.seq;
                let ack = v1::DeliverAck { conversation: message.conversation.clone(), seq };
                connection.send(&Frame::new(0, ack)).await?;
                delivered.insert(message.conversation);
            }
            // The others may take longer to set up than the server waits for a silent
            // client: answer when it asks.
            Some(Body::Ping(ping)) => connection.answer_ping(frame.rid, &ping).await?,
            _ => {}
        }
    }
    Ok(())
}
