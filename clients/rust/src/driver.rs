//! The I/O side: one task that owns the WebSocket, waits on the application's commands,
//! the server's frames and the core's timers, writes what the core queued, and hands the
//! core's events to the application through a bounded channel (the [`Outlet`]): while that
//! channel is full, the socket is not read, so an application that does not keep up slows
//! the server's pushes down (the server's slow-consumer limit applies) instead of growing
//! a queue in the client.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::http::header::SEC_WEBSOCKET_PROTOCOL;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message as WsMessage};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::core::{ABNORMAL, Command, Core};
use crate::error::ClientError;
use crate::options::Token;
use crate::types::Event;
use crate::wire::{self, Encoding, v1};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How the loop over one phase ended.
enum Step {
    Continue,
    /// The application dropped every handle or closed the client.
    Stop,
}

/// The core's events on their way to the application's bounded channel.
pub(crate) struct Outlet {
    /// What the core emitted (the core never waits, so this side is unbounded; it holds
    /// at most what one frame or timer produced while the application's channel is full).
    emitted: mpsc::UnboundedReceiver<Event>,
    /// The application's side ([`Events`](crate::Events)).
    application: mpsc::Sender<Event>,
    /// An event that did not fit: nothing more is read from the socket until it does.
    held: Option<Event>,
}

impl Outlet {
    /// The core's sender and the application's receiver, and the outlet between them.
    pub(crate) fn new(capacity: usize) -> ((mpsc::UnboundedSender<Event>, mpsc::Receiver<Event>), Self) {
        let (core, emitted) = mpsc::unbounded_channel();
        let (application, events) = mpsc::channel(capacity);
        ((core, events), Self { emitted, application, held: None })
    }

    /// Moves what fits into the application's channel; true when it is full (an event is held).
    fn pass(&mut self) -> bool {
        loop {
            let Some(event) = self.held.take().or_else(|| self.emitted.try_recv().ok()) else {
                return false;
            };
            match self.application.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.held = Some(event);
                    return true;
                }
                // Nobody reads events any more: the application's choice (a dropped delivery
                // counts as handled, as it would had it been read and dropped).
                Err(TrySendError::Closed(_)) => {}
            }
        }
    }

    /// Waits until the application made room, then moves the held event.
    async fn room(&mut self) {
        match self.application.reserve().await {
            Ok(permit) => {
                if let Some(event) = self.held.take() {
                    permit.send(event);
                }
            }
            Err(_) => self.held = None,
        }
    }

    /// After the end: hands over what is left, waiting for room, until the application
    /// read it all or dropped its side.
    async fn drain(mut self) {
        while let Some(event) = self.held.take().or_else(|| self.emitted.try_recv().ok()) {
            if self.application.send(event).await.is_err() {
                return;
            }
        }
    }
}

/// Runs the client until it is closed.
pub(crate) async fn run(mut core: Core, mut commands: mpsc::UnboundedReceiver<Command>, mut outlet: Outlet) {
    let tls = core.options.tls.clone().unwrap_or_else(default_tls);
    'life: loop {
        // Reconnecting: wait out the delay, serving commands (sends queue meanwhile).
        while let Some(at) = core.reconnect_at {
            if Instant::now() >= at {
                break;
            }
            if let Step::Stop = idle_step(&mut core, &mut commands, &mut outlet, Some(at)).await {
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
                    step = idle_step(&mut core, &mut commands, &mut outlet, None) => {
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
        let opening = open(url, core.options.encoding, Arc::clone(&tls));
        tokio::pin!(opening);
        let opened = loop {
            tokio::select! {
                opened = &mut opening => break Some(opened),
                step = idle_step(&mut core, &mut commands, &mut outlet, None) => {
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
        let (code, reason, stop) = session(&mut core, &mut commands, &mut outlet, socket).await;
        if stop {
            break;
        }
        core.on_drop(code, reason);
    }
    core.close();
    core.finish_close();
    // The core is gone with this task's end; its last events (closed) still go out.
    drop(core);
    outlet.drain().await;
}

/// Serves commands and timers while no socket is open; `until` bounds the wait.
async fn idle_step(
    core: &mut Core,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    outlet: &mut Outlet,
    until: Option<Instant>,
) -> Step {
    let wake = [until, core.next_wakeup()].into_iter().flatten().min().unwrap_or_else(far_future);
    let full = outlet.pass();
    tokio::select! {
        command = commands.recv() => match command {
            Some(command) => {
                core.on_command(command);
                if core.is_closed() { Step::Stop } else { Step::Continue }
            }
            None => Step::Stop,
        },
        () = outlet.room(), if full => Step::Continue,
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
    outlet: &mut Outlet,
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
        let full = outlet.pass();
        let wake = core.next_wakeup().unwrap_or_else(far_future);
        // A close waiting for deliveries reads nothing new: what arrives now stays unacked,
        // for the server to push again to the device.
        let read = !full && !core.is_closing();
        tokio::select! {
            () = outlet.room(), if full => {}
            incoming = stream.next(), if read => match incoming {
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
            () = sleep_until(wake) => {
                if full {
                    core.reading_paused();
                }
                core.on_timer(Instant::now());
            }
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

/// The TLS of `wss://` when the application gave none: the Mozilla roots, rustls on ring.
fn default_tls() -> Arc<rustls::ClientConfig> {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports rustls's default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// Opens the WebSocket asking for the encoding's subprotocol (`wss://` with `tls`).
async fn open(url: String, encoding: Encoding, tls: Arc<rustls::ClientConfig>) -> Result<Socket, String> {
    let mut request = url.as_str().into_client_request().map_err(|error| format!("cannot open {url}: {error}"))?;
    request.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(encoding.subprotocol()));
    // The server's frames are read whatever their size. PROTOCOL.md's 1 MiB (close 1009)
    // bounds what the server reads, not what it writes: a `history`, `sync` or `subscribed`
    // reply holds a page of messages (up to `delivery.max_page`, 500), each up to that size.
    // Under any lower cap such a reply could never be read: the client would drop the socket,
    // ask again on the next connection, and go round for ever.
    let config = WebSocketConfig::default().read_buffer_size(4 * 1024).max_message_size(None).max_frame_size(None);
    let connector = Some(Connector::Rustls(tls));
    let (socket, response) = tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector)
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
