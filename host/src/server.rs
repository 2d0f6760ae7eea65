//! `herald serve`: opens storage (migrating it), starts the writers, and serves HTTP until
//! told to stop. Shutdown is a token passed down, not a global.

use std::net::SocketAddr;
use std::time::Duration;

use axum::serve::ListenerExt;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

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
    task: JoinHandle<std::io::Result<()>>,
    node: Arc<Node>,
}

/// Opens storage, migrates it, binds the listener and starts serving.
///
/// # Errors
/// [`ServeError`] when the database cannot be opened or migrated, or the address is taken.
pub async fn start(config: &Config) -> Result<RunningServer, ServeError> {
    let node = Node::open(config.clone()).await?;

    let listener =
        TcpListener::bind(config.listen).await.map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let app = api::router(Arc::clone(&node));
    let (stop, mut stopped) = watch::channel(false);
    let keepalive_ms = config.gateway.tcp_keepalive_ms;
    let task = tokio::spawn(async move {
        // Frames are small and latency matters: no Nagle delay (it would hold a deliver
        // back until the client's delayed ACK, ~40 ms).
        let keepalive = (keepalive_ms > 0).then(|| {
            TcpKeepalive::new()
                .with_time(Duration::from_millis(keepalive_ms))
                .with_interval(Duration::from_secs(10))
                .with_retries(3)
        });
        let listener = listener.tap_io(move |tcp| {
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::warn!(%error, "cannot set TCP_NODELAY");
            }
            if let Some(keepalive) = &keepalive
                && let Err(error) = SockRef::from(&*tcp).set_tcp_keepalive(keepalive)
            {
                tracing::warn!(%error, "cannot set TCP keepalive");
            }
        });
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            })
            .await
    });
    tracing::info!(%addr, dev = config.dev, "herald is serving");
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

    /// Stops accepting, lets requests in flight finish, flushes queued writes and closes
    /// the database.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.node.shut_down().await;
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "server stopped with an error"),
            Err(error) => tracing::error!(%error, "server task failed"),
        }
        let node = self.node;
        node.committer.clone().close().await;
        node.leave_cluster().await;
        node.database.close().await;
    }
}
