//! Framing on a link: a 4-byte big-endian length, then that many bytes of one protobuf
//! `PeerFrame`.
//!
//! Reading checks the length against a limit before allocating anything, so a peer (or
//! anyone who reached the port before the handshake) cannot make a node allocate more than
//! the limit for one frame. Writing goes through one task per link, which batches whatever
//! is queued into one flush.

use bytes::{BufMut as _, Bytes, BytesMut};
use herald_proto::peer::v1::PeerFrame;
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

/// Largest frame on an open link, in bytes (not counting the length prefix). A message
/// body is far smaller; a frame this large is a broken or hostile peer.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Largest frame before the handshake ends: a challenge or hello is under 100 bytes, and
/// an unauthenticated caller must not make the node allocate more.
pub const MAX_HANDSHAKE_FRAME_BYTES: usize = 1024;

/// Bytes of the length prefix.
const PREFIX_BYTES: usize = 4;

/// A frame could not be read or written; the link it was on is done.
#[derive(Debug, thiserror::Error)]
pub(super) enum FrameError {
    #[error("the peer closed the link")]
    Closed,
    #[error("a frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    #[error("a frame is not a valid peer frame: {0}")]
    Invalid(#[from] prost::DecodeError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A frame waiting for a link's writer.
pub(super) struct Outgoing {
    /// The frame with its length prefix ([`encode`]).
    pub frame: Bytes,
    /// Told once the frame has been handed to the socket; dropped if it never is.
    pub written: Option<oneshot::Sender<()>>,
}

/// `frame` with its length prefix, ready to write.
///
/// # Errors
/// [`FrameError::TooLarge`] when the frame exceeds [`MAX_FRAME_BYTES`]; the link is fine,
/// only this frame cannot travel on it.
pub(super) fn encode(frame: &PeerFrame) -> Result<Bytes, FrameError> {
    let len = frame.encoded_len();
    let prefix = u32::try_from(len).ok().filter(|_| len <= MAX_FRAME_BYTES);
    let Some(prefix) = prefix else { return Err(FrameError::TooLarge { len, limit: MAX_FRAME_BYTES }) };
    let mut buffer = BytesMut::with_capacity(PREFIX_BYTES + len);
    buffer.put_u32(prefix);
    frame.encode(&mut buffer).map_err(|error| std::io::Error::other(error.to_string()))?;
    Ok(buffer.freeze())
}

/// Reads one frame of at most `limit` bytes.
///
/// # Errors
/// [`FrameError::Closed`] when the link ends at a frame boundary; any other error when it
/// ends inside a frame, the frame is too large or it does not decode.
pub(super) async fn read<R: AsyncRead + Unpin>(reader: &mut R, limit: usize) -> Result<PeerFrame, FrameError> {
    let len = match reader.read_u32().await {
        Ok(len) => usize::try_from(len).unwrap_or(usize::MAX),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(error) => return Err(error.into()),
    };
    if len > limit {
        return Err(FrameError::TooLarge { len, limit });
    }
    let mut buffer = BytesMut::zeroed(len);
    reader.read_exact(&mut buffer).await?;
    Ok(PeerFrame::decode(buffer.freeze())?)
}

/// Writes one frame and flushes it (the handshake, before a link has its writer task).
pub(super) async fn write<W: AsyncWrite + Unpin>(writer: &mut W, frame: &PeerFrame) -> Result<(), FrameError> {
    writer.write_all(&encode(frame)?).await?;
    writer.flush().await?;
    Ok(())
}

/// Bytes a link's writer gathers at most before it flushes, however much is still queued.
const MAX_BATCH_BYTES: usize = 64 * 1024;

/// A link's writer: writes what is queued, one flush per batch, until the queue closes.
///
/// Before each flush it lets the tasks that are ready run once ([`yield_now`]), and takes
/// what they queued into the same flush: the responses (or requests) that one read of the
/// other side's frames set going are mostly ready together, and without the pause each
/// went out in a write of its own, waking the peer once per frame. A batch stops growing
/// at [`MAX_BATCH_BYTES`].
///
/// # Errors
/// The I/O error that ended the link.
///
/// [`yield_now`]: tokio::task::yield_now
pub(super) async fn write_queue<W: AsyncWrite + Unpin>(
    writer: W,
    mut queue: mpsc::Receiver<Outgoing>,
) -> std::io::Result<()> {
    let mut writer = BufWriter::with_capacity(MAX_BATCH_BYTES, writer);
    let mut written = Vec::new();
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        let mut bytes = 0;
        // Twice at most: what is queued now, then what the tasks ready now add to it.
        for round in 0..2 {
            while bytes < MAX_BATCH_BYTES
                && let Some(mut frame) = next.take().or_else(|| queue.try_recv().ok())
            {
                bytes += frame.frame.len();
                writer.write_all(&frame.frame).await?;
                written.extend(frame.written.take());
            }
            if round == 0 && bytes < MAX_BATCH_BYTES {
                tokio::task::yield_now().await;
            }
        }
        writer.flush().await?;
        for done in written.drain(..) {
            // The requester may have stopped waiting; the frame is out either way.
            let _ = done.send(());
        }
    }
    Ok(())
}

/// Aborts a link's task when the link is dropped, so its socket half closes with it.
pub(super) struct AbortOnDrop(pub AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use herald_proto::peer::v1::{Done, Response, peer_frame::Body, response::Outcome};

    use super::*;

    fn done(id: u64) -> PeerFrame {
        PeerFrame { body: Some(Body::Response(Response { id, outcome: Some(Outcome::Done(Done {})) })) }
    }

    #[tokio::test]
    async fn frames_round_trip_and_end_cleanly() {
        let mut bytes = encode(&done(7)).expect("small").to_vec();
        bytes.extend_from_slice(&encode(&done(8)).expect("small"));
        let mut reader = bytes.as_slice();
        assert_eq!(read(&mut reader, MAX_FRAME_BYTES).await.expect("first"), done(7));
        assert_eq!(read(&mut reader, MAX_FRAME_BYTES).await.expect("second"), done(8));
        assert!(matches!(read(&mut reader, MAX_FRAME_BYTES).await, Err(FrameError::Closed)));
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_before_allocating() {
        let mut reader: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read(&mut reader, MAX_FRAME_BYTES).await,
            Err(FrameError::TooLarge { len: 0xffff_ffff, limit: MAX_FRAME_BYTES })
        ));
    }

    #[tokio::test]
    async fn truncated_and_garbled_frames_are_errors_not_panics() {
        let whole = encode(&done(1)).expect("small");
        let mut truncated = &whole[..whole.len() - 1];
        assert!(matches!(read(&mut truncated, MAX_FRAME_BYTES).await, Err(FrameError::Io(_))));
        let mut garbled: &[u8] = &[0, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(matches!(read(&mut garbled, MAX_FRAME_BYTES).await, Err(FrameError::Invalid(_))));
    }

    /// Records each write it is given, as the socket would see it.
    #[derive(Clone, Default)]
    struct Writes(std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bytes: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.0.lock().expect("not poisoned").push(bytes.to_vec());
            std::task::Poll::Ready(Ok(bytes.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// Frames queued by tasks that were ready when the first was queued (the responses one
    /// read of requests set going) leave in the first frame's write, not one write each.
    #[tokio::test]
    async fn frames_queued_by_tasks_ready_together_leave_in_one_write() {
        let writes = Writes::default();
        let (queue, frames) = mpsc::channel(16);
        let writer = tokio::spawn(write_queue(writes.clone(), frames));
        let outgoing = |id| Outgoing { frame: encode(&done(id)).expect("small"), written: None };
        queue.send(outgoing(1)).await.expect("writer running");
        let others: Vec<_> = (2..=4)
            .map(|id| {
                let queue = queue.clone();
                tokio::spawn(async move { queue.send(outgoing(id)).await.expect("writer running") })
            })
            .collect();
        for other in others {
            other.await.expect("no panic");
        }
        drop(queue);
        writer.await.expect("no panic").expect("written");

        let writes = writes.0.lock().expect("not poisoned").clone();
        assert_eq!(writes.len(), 1, "one write for the four frames");
        let mut reader = writes[0].as_slice();
        for id in 1..=4 {
            assert_eq!(read(&mut reader, MAX_FRAME_BYTES).await.expect("a frame"), done(id), "in queue order");
        }
    }
}
