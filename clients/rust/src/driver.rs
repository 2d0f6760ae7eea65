//! The I/O side: one task that owns the WebSocket, waits on the application's commands,
//! the server's frames and the core's timers, and writes what the core queued.

use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::http::header::SEC_WEBSOCKET_PROTOCOL;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message as WsMessage};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::core::{ABNORMAL, Command, Core};
use crate::error::ClientError;
use crate::options::Token;
use crate::types::Event;
use crate::wire::{self, Encoding, v1};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Largest frame read: the server's own default limit (PROTOCOL.md, close 1009).
const MAX_FRAME_BYTES: usize = 1_048_576;

/// How the loop over one phase ended.
enum Step {
    Continue,
    /// The application dropped every handle or closed the client.
    Stop,
}

/// Runs the client until it is closed.
pub(crate) async fn run(mut core: Core, mut commands: mpsc::UnboundedReceiver<Command>) {
    'life: loop {
        // Reconnecting: wait out the delay, serving commands (sends queue meanwhile).
        while let Some(at) = core.reconnect_at {
            if Instant::now() >= at {
                break;
            }
            if let Step::Stop = idle_step(&mut core, &mut commands, Some(at)).await {
                break 'life;
            }
        }
        if core.is_closed() {
            break;
        }
        if let Some(reason) = core.token_needed() {
            let Token::Provider(provider) = core.options.token.clone() else {
                continue;
            };
            // Commands are served meanwhile: a close must not wait for a slow provider.
            let asking = provider.token(reason);
            tokio::pin!(asking);
            let answer = loop {
                tokio::select! {
                    answer = &mut asking => break answer,
                    step = idle_step(&mut core, &mut commands, None) => {
                        if let Step::Stop = step {
                            break 'life;
                        }
                    }
                }
            };
            match answer {
                Ok(token) if !token.is_empty() => core.set_token(token),
                Ok(_) => {
                    core.token_failed("the token provider returned no token".to_owned());
                    continue;
                }
                Err(why) => {
                    core.token_failed(why);
                    continue;
                }
            }
        }
        core.begin_attempt();
        let url = core.url().to_owned();
        let opening = open(url, core.options.encoding);
        tokio::pin!(opening);
        let opened = loop {
            tokio::select! {
                opened = &mut opening => break Some(opened),
                step = idle_step(&mut core, &mut commands, None) => {
                    if let Step::Stop = step {
                        break 'life;
                    }
                    if let Some((code, reason)) = core.take_drop_request() {
                        core.on_drop(code, reason);
                        break None;
                    }
                }
            }
        };
        let socket = match opened {
            None => continue,
            Some(Err(why)) => {
                core.emit(Event::Error(ClientError::Protocol(why.clone())));
                core.on_drop(ABNORMAL, why);
                continue;
            }
            Some(Ok(socket)) => socket,
        };
        core.socket_opened();
        let (code, reason, stop) = session(&mut core, &mut commands, socket).await;
        if stop {
            break;
        }
        core.on_drop(code, reason);
    }
    core.close();
    core.finish_close();
}

/// Serves commands and timers while no socket is open; `until` bounds the wait.
async fn idle_step(core: &mut Core, commands: &mut mpsc::UnboundedReceiver<Command>, until: Option<Instant>) -> Step {
    let wake = [until, core.next_wakeup()].into_iter().flatten().min().unwrap_or_else(far_future);
    tokio::select! {
        command = commands.recv() => match command {
            Some(command) => {
                let closing = matches!(command, Command::Close { .. });
                core.on_command(command);
                if closing { Step::Stop } else { Step::Continue }
            }
            None => Step::Stop,
        },
        () = sleep_until(wake) => {
            core.on_timer(Instant::now());
            Step::Continue
        }
    }
}

/// One socket's life: returns the close code and reason, and whether the client stopped.
async fn session(
    core: &mut Core,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    socket: Socket,
) -> (u16, String, bool) {
    let encoding = core.options.encoding;
    let (mut sink, mut stream) = socket.split();
    loop {
        if let Err(why) = write(&mut sink, core.take_outbox(), encoding).await {
            return (ABNORMAL, why, false);
        }
        if core.is_closed() {
            let close = CloseFrame { code: CloseCode::Normal, reason: "client closed".into() };
            let _ = sink.send(WsMessage::Close(Some(close))).await;
            return (1000, "closed by the client".to_owned(), true);
        }
        if let Some((code, reason)) = core.take_drop_request() {
            // Dropped without a closing handshake: the peer may be gone for good.
            return (code, reason, false);
        }
        let wake = core.next_wakeup().unwrap_or_else(far_future);
        tokio::select! {
            incoming = stream.next() => match incoming {
                Some(Ok(WsMessage::Binary(data))) => receive(core, wire::decode(data, Encoding::Proto)),
                Some(Ok(WsMessage::Text(text))) => {
                    let data = bytes::Bytes::from(text);
                    receive(core, wire::decode(data, Encoding::Json));
                }
                Some(Ok(WsMessage::Close(frame))) => {
                    let (code, reason) = frame.map_or((ABNORMAL, String::new()), |frame| (u16::from(frame.code), frame.reason.to_string()));
                    return (code, reason, false);
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return (ABNORMAL, error.to_string(), false),
                None => return (ABNORMAL, "the socket ended without a close frame".to_owned(), false),
            },
            command = commands.recv() => match command {
                Some(command) => core.on_command(command),
                None => core.close(),
            },
            () = sleep_until(wake) => core.on_timer(Instant::now()),
        }
    }
}

fn receive(core: &mut Core, decoded: Result<v1::Frame, String>) {
    match decoded {
        Ok(frame) => core.on_frame(frame),
        Err(error) => core.emit(Event::Error(ClientError::Protocol(format!("undecodable frame: {error}")))),
    }
}

async fn write<S>(sink: &mut S, frames: Vec<v1::Frame>, encoding: Encoding) -> Result<(), String>
where
    S: futures_util::Sink<WsMessage, Error = tungstenite::Error> + Unpin,
{
    if frames.is_empty() {
        return Ok(());
    }
    for frame in &frames {
        let message = match encoding {
            Encoding::Proto => WsMessage::Binary(wire::encode_proto(frame).into()),
            Encoding::Json => WsMessage::Text(wire::encode_json(frame)?.into()),
        };
        sink.feed(message).await.map_err(|error| error.to_string())?;
    }
    sink.flush().await.map_err(|error| error.to_string())
}

/// Opens the WebSocket asking for the encoding's subprotocol.
async fn open(url: String, encoding: Encoding) -> Result<Socket, String> {
    let mut request = url.as_str().into_client_request().map_err(|error| format!("cannot open {url}: {error}"))?;
    request.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(encoding.subprotocol()));
    let config = WebSocketConfig::default()
        .read_buffer_size(4 * 1024)
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES));
    let (socket, response) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .map_err(|error| format!("cannot open {url}: {error}"))?;
    let answered = response.headers().get(SEC_WEBSOCKET_PROTOCOL).and_then(|value| value.to_str().ok());
    if answered != Some(encoding.subprotocol()) {
        return Err(format!("{url} answered subprotocol {answered:?}, not {}", encoding.subprotocol()));
    }
    Ok(socket)
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3_600)
}

/// Sends `Close` and waits until the driver finished it.
pub(crate) async fn close(commands: &mpsc::UnboundedSender<Command>) {
    let (done, finished) = oneshot::channel();
    if commands.send(Command::Close { done }).is_ok() {
        let _ = finished.await;
    }
}
