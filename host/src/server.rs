//! `herald serve`: opens storage (migrating it), starts the writers, and serves HTTP until
//! told to stop. Shutdown is a token passed down, not a global.
//!
//! Connections are served by hyper's HTTP/1 server with a header read timeout
//! (`gateway.header_read_timeout_ms`): a client that trickles its headers, or opens a
//! socket and sends nothing, is cut off instead of holding a connection for ever.
//!
//! With `[tls]` set, every connection is TLS (`https://`, `wss://`; `crate::tls`): its
//! handshake must finish within the same header read timeout.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_service::Service as _;

use std::sync::Arc;

use crate::api;
use crate::config::Config;
use crate::node::{Node, NodeError};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// A server that is accepting connections.
pub struct RunningServer {
    /// The address it listens on (useful with port 0).
    pub addr: SocketAddr,
    /// Flip to `true` to start a graceful shutdown.
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    node: Arc<Node>,
}

/// Opens storage, migrates it, binds the listener and starts serving.
///
/// # Errors
/// [`ServeError`] when the database cannot be opened or migrated, or the address is taken.
pub async fn start(config: &Config) -> Result<RunningServer, ServeError> {
    // Bound before the node opens: in cluster mode the address is part of its membership
    // (nginx's upstream lists it). Connections wait in the backlog until serving starts.
    let listener =
        TcpListener::bind(config.listen).await.map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let node = Node::open(config.clone(), addr).await?;
    let app = api::router(Arc::clone(&node));
    let (stop, stopped) = watch::channel(false);
    let socket = SocketOptions::of(config);
    let tls = node.tls_acceptor();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let task = tokio::spawn(serve_http(listener, app, socket, tls, stopped));
    tracing::info!(%addr, dev = config.dev, scheme, "herald is serving");
    // Only now that connections are accepted may other nodes send clients here.
    node.serve_clients_at(addr).await;
    Ok(RunningServer { addr, stop, task, node })
}

impl RunningServer {
    /// Resolves when the node cannot go on (cluster mode: its lease was lost for good);
    /// the caller then shuts it down and exits with an error, and a service manager
    /// starts it again as a new member.
    pub async fn must_stop(&self) {
        self.node.must_stop().await;
    }

    /// Answers `/readyz` with 503 for `gateway.shutdown_delay_ms` while still serving, then
    /// stops accepting, lets requests in flight finish, flushes queued writes and closes
    /// the database.
    pub async fn shutdown(self) {
        let delay = self.node.config().gateway.shutdown_delay_ms;
        if delay > 0 {
            self.node.announce_shutdown();
            tracing::info!(delay_ms = delay, "/readyz answers 503 until the node stops accepting");
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let _ = self.stop.send(true);
        self.node.shut_down().await;
        if let Err(error) = self.task.await {
            tracing::error!(%error, "server task failed");
        }
        self.node.close().await;
    }
}

/// How each accepted client socket is set up.
#[derive(Clone, Copy)]
struct SocketOptions {
    keepalive: Option<Duration>,
    header_read_timeout: Duration,
}

impl SocketOptions {
    fn of(config: &Config) -> Self {
        let keepalive_ms = config.gateway.tcp_keepalive_ms;
        Self {
            keepalive: (keepalive_ms > 0).then(|| Duration::from_millis(keepalive_ms)),
            header_read_timeout: Duration::from_millis(config.gateway.header_read_timeout_ms),
        }
    }

    fn apply(self, tcp: &TcpStream) {
        // Frames are small and latency matters: no Nagle delay (it would hold a deliver
        // back until the client's delayed ACK, ~40 ms).
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::warn!(%error, "cannot set TCP_NODELAY");
        }
        if let Some(time) = self.keepalive {
            let keepalive = TcpKeepalive::new().with_time(time).with_interval(Duration::from_secs(10)).with_retries(3);
            if let Err(error) = SockRef::from(tcp).set_tcp_keepalive(&keepalive) {
                tracing::warn!(%error, "cannot set TCP keepalive");
            }
        }
    }
}

/// Accepts connections and serves each on its own task until `stopped`; then stops
/// accepting, lets requests under way finish and waits for their connections to close
/// (upgraded WebSockets are the gateway's from the upgrade on, and do not hold this up).
async fn serve_http(
    listener: TcpListener,
    app: Router,
    socket: SocketOptions,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stopped: watch::Receiver<bool>,
) {
    // Each connection task holds a receiver of `closing`; `closing.closed()` resolves once
    // the last has finished.
    let (closing, _) = watch::channel(false);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        match accepted {
            Ok((tcp, remote)) => {
                socket.apply(&tcp);
                let (app, closing) = (app.clone(), closing.subscribe());
                match &tls {
                    None => drop(tokio::spawn(serve_connection(tcp, remote, app, socket, closing))),
                    Some(tls) => drop(tokio::spawn(serve_tls(tls.clone(), tcp, remote, app, socket, closing))),
                }
            }
            // Out of file descriptors and the like: wait rather than spin.
            Err(error) => {
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    closing.send_replace(true);
    closing.closed().await;
}

/// A TLS connection: its handshake, bounded by the header read timeout, then HTTP.
async fn serve_tls(
    tls: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    remote: SocketAddr,
    app: Router,
    socket: SocketOptions,
    closing: watch::Receiver<bool>,
) {
    match tokio::time::timeout(socket.header_read_timeout, tls.accept(tcp)).await {
        Ok(Ok(stream)) => serve_connection(stream, remote, app, socket, closing).await,
        Ok(Err(error)) => {
            metrics::counter!("herald_tls_handshake_failures_total").increment(1);
            tracing::debug!(%error, %remote, "tls handshake failed");
        }
        Err(_) => {
            metrics::counter!("herald_tls_handshake_failures_total").increment(1);
            tracing::debug!(%remote, "tls handshake not finished within gateway.header_read_timeout_ms");
        }
    }
}

/// One client connection: HTTP/1 with upgrades, its address given to the handlers as
/// axum's `ConnectInfo`, closed gracefully when `closing` flips.
async fn serve_connection(
    io: impl AsyncRead + AsyncWrite + Send + Unpin + 'static,
    remote: SocketAddr,
    app: Router,
    socket: SocketOptions,
    mut closing: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(remote));
        let mut app = app.clone();
        async move { app.call(request).await }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(socket.header_read_timeout)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!(%error, %remote, "connection ended with an error");
                }
                return;
            }
            _ = closing.wait_for(|closing| *closing), if !shutting_down => {
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
