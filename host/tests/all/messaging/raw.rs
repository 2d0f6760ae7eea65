//! A hand-rolled WebSocket client (RFC 6455) over a plain TCP socket, for what a polite
//! library client cannot do: stay completely silent (never answer a WebSocket-level or
//! protocol-level ping), and see exactly which control frames the server sends.

use std::time::Duration;

use herald_proto::v1::{self, Frame};
use herald_proto::{DecodeLimits, Encoding, decode_frame, encode_proto};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::server::Herald;

/// What the server sent next.
#[derive(Debug)]
#[allow(dead_code, reason = "the payloads are read through Debug, in failure messages")]
pub enum Event {
    /// A protobuf frame (binary message).
    Frame(Frame),
    /// A text message (unexpected on a protobuf connection).
    Text(String),
    /// A WebSocket ping control frame.
    WsPing,
    /// A close frame, with its code if it had one.
    Close(Option<u16>, String),
    /// The TCP connection ended (EOF or reset) without a close frame.
    Ended(String),
    /// Nothing before the deadline.
    Timeout,
}

/// A WebSocket connection speaking `herald.v1.proto`, nothing automatic.
pub struct RawSocket {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl RawSocket {
    /// TCP connect and the opening handshake with `herald.v1.proto`.
    pub async fn open(herald: &Herald) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", herald.port)).await.expect("TCP connect to herald");
        let request = format!(
            "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Protocol: herald.v1.proto\r\n\r\n",
            herald.port
        );
        stream.write_all(request.as_bytes()).await.expect("write the handshake");
        let mut buffer = Vec::new();
        let deadline = Instant::now() + super::WAIT;
        let end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout_at(deadline, stream.read(&mut chunk))
                .await
                .expect("handshake response in time")
                .expect("read the handshake response");
            assert!(read > 0, "the server closed during the handshake");
            buffer.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "WebSocket upgrade refused: {head}\n{}", herald.log_tail());
        // RFC 6455's example key has this well-known accept value.
        assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "wrong Sec-WebSocket-Accept: {head}");
        buffer.drain(..end);
        Self { stream, buffer }
    }

    /// Sends a masked frame with `opcode` (2 binary, 1 text, 9 ping, 10 pong, 8 close).
    pub async fn send(&mut self, opcode: u8, payload: &[u8]) {
        let mut frame = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask: [u8; 4] = rand::random();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream.write_all(&frame).await.expect("write a frame");
    }

    /// Sends a protobuf frame.
    pub async fn send_frame(&mut self, frame: &Frame) {
        self.send(2, &encode_proto(frame)).await;
    }

    /// Sends `connect` with a dev token and expects `connected`.
    pub async fn login(&mut self, user: &str, device: &str) -> v1::Connected {
        let connect = v1::Connect { token: format!("dev:{user}"), device_id: device.into(), client: None };
        self.send_frame(&Frame::new(1, connect)).await;
        let deadline = Instant::now() + super::WAIT;
        loop {
            match self.next(deadline).await {
                Event::Frame(Frame { body: Some(v1::frame::Body::Connected(connected)), .. }) => return connected,
                Event::Frame(_) | Event::WsPing => continue,
                other => panic!("expected connected, got {other:?}"),
            }
        }
    }

    /// The next thing the server sent, or `Timeout` at `deadline`.
    pub async fn next(&mut self, deadline: Instant) -> Event {
        let mut message: Vec<u8> = Vec::new();
        let mut message_opcode = 0u8;
        loop {
            let (fin, opcode, payload) = match self.read_frame(deadline).await {
                Ok(Some(frame)) => frame,
                Ok(None) => return Event::Timeout,
                Err(why) => return Event::Ended(why),
            };
            match opcode {
                0x8 => {
                    let code = (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                    let reason = String::from_utf8_lossy(payload.get(2..).unwrap_or_default()).into_owned();
                    return Event::Close(code, reason);
                }
                0x9 => return Event::WsPing,
                0xA => continue,
                0x0 => message.extend_from_slice(&payload),
                _ => {
                    message_opcode = opcode;
                    message = payload;
                }
            }
            if !fin {
                continue;
            }
            return match message_opcode {
                0x2 => {
                    let frame = decode_frame(std::mem::take(&mut message), Encoding::Proto, &DecodeLimits::default())
                        .unwrap_or_else(|error| panic!("the server sent an undecodable frame: {error}"));
                    Event::Frame(frame)
                }
                _ => Event::Text(String::from_utf8_lossy(&message).into_owned()),
            };
        }
    }

    /// Reads one WebSocket frame: `Ok(None)` at the deadline, `Err` when the connection ends.
    async fn read_frame(&mut self, deadline: Instant) -> Result<Option<(bool, u8, Vec<u8>)>, String> {
        loop {
            if let Some((consumed, frame)) = parse(&self.buffer)? {
                self.buffer.drain(..consumed);
                return Ok(Some(frame));
            }
            let mut chunk = vec![0u8; 64 * 1024];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Err(_) => return Ok(None),
                Ok(Ok(0)) => return Err("EOF without a close frame".into()),
                Ok(Ok(read)) => self.buffer.extend_from_slice(&chunk[..read]),
                Ok(Err(error)) => return Err(format!("read failed: {error}")),
            }
        }
    }

    /// Reads until the connection closes or `timeout`; returns the close event, how long it
    /// took, and what came before it.
    pub async fn until_closed(&mut self, timeout: Duration) -> (Event, Duration, Vec<Event>) {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut before = Vec::new();
        loop {
            match self.next(deadline).await {
                event @ (Event::Close(..) | Event::Ended(_) | Event::Timeout) => {
                    return (event, start.elapsed(), before);
                }
                event => before.push(event),
            }
        }
    }
}

/// Parses one server frame (unmasked) from the front of `data`, if complete.
#[allow(clippy::type_complexity)]
fn parse(data: &[u8]) -> Result<Option<(usize, (bool, u8, Vec<u8>))>, String> {
    if data.len() < 2 {
        return Ok(None);
    }
    let fin = data[0] & 0x80 != 0;
    let opcode = data[0] & 0x0f;
    let masked = data[1] & 0x80 != 0;
    let (length, mut offset) = match data[1] & 0x7f {
        126 if data.len() >= 4 => (usize::from(u16::from_be_bytes([data[2], data[3]])), 4),
        127 if data.len() >= 10 => {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&data[2..10]);
            (usize::try_from(u64::from_be_bytes(bytes)).map_err(|_| "frame too long")?, 10)
        }
        126 | 127 => return Ok(None),
        n => (usize::from(n), 2),
    };
    if masked {
        return Err("the server masked a frame (RFC 6455 forbids it)".into());
    }
    if data.len() < offset + length {
        return Ok(None);
    }
    let payload = data[offset..offset + length].to_vec();
    offset += length;
    Ok(Some((offset, (fin, opcode, payload))))
}
