//! One test body, two topologies: the behaviour suite (`behaviour`) runs each scenario on one
//! embedded node (SQLite) and on three cluster nodes (Redis and PostgreSQL or MariaDB).
//!
//! On three nodes a scenario's users are spread the way that strains cluster mode most: the
//! sender connects to a node that does not own the conversation, so every send is forwarded,
//! and the recipients sit on the third node, so every message comes back over another hop.
//! A scenario asks [`World::places`] where each part goes; on one node every place is node 0.

use std::time::Duration;

use herald_host::store::Backend;

use super::WAIT;
use super::client::Client;
use super::nodes::Nodes;
use super::server::{DEV_KEY, Herald};
use crate::support::poll::poll;

/// Where a scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One embedded node on a temporary SQLite file.
    OneNode,
    /// Three cluster nodes on the local Redis and a fresh database of this backend.
    ThreeNodes(Backend),
}

/// The running nodes of one scenario.
pub enum World {
    One(Herald),
    Three(Nodes),
}

/// Where the parts of one conversation are: the node owning it, the node its sender connects
/// to, and the node its recipients connect to (three different nodes on three).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Places {
    pub owner: usize,
    pub sender: usize,
    pub recipient: usize,
}

impl World {
    /// Starts `topology` with extra `HERALD_*` settings on every node.
    pub async fn start(topology: Topology, extra: &[(&str, &str)]) -> Self {
        match topology {
            Topology::OneNode => {
                let options = extra.iter().fold(Herald::with(), |options, (key, value)| options.set(key, value));
                Self::One(options.start().await)
            }
            Topology::ThreeNodes(backend) => Self::Three(Nodes::start_with(3, backend, extra).await),
        }
    }

    /// Node `at` (0 on one node).
    pub fn node(&self, at: usize) -> &Herald {
        match self {
            Self::One(herald) => herald,
            Self::Three(nodes) => &nodes.nodes[at],
        }
    }

    /// Whether this is the three-node topology.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Three(_))
    }

    /// Where `conversation`'s parts go when `sender` sends to it.
    pub async fn places(&self, sender: &str, conversation: &str) -> Places {
        match self {
            Self::One(_) => Places { owner: 0, sender: 0, recipient: 0 },
            Self::Three(nodes) => {
                let owner = nodes.owner_of(0, sender, conversation).await;
                Places { owner, sender: (owner + 1) % 3, recipient: (owner + 2) % 3 }
            }
        }
    }

    /// Connects `user`'s `device` to node `at`.
    pub async fn connect(&self, at: usize, user: &str, device: &str) -> Client {
        Client::connect(self.node(at), user, device).await
    }

    /// Waits until node `at` lists `user`'s `device` as online: `connected` is sent before
    /// the device's route is written, so presence may lag it.
    pub async fn wait_until_online(&self, at: usize, user: &str, device: &str) {
        let online = poll().within(WAIT).every(Duration::from_millis(20));
        if let Err(timed_out) =
            online.try_until(&format!("{user}/{device} online"), async || self.is_online(at, user, device).await).await
        {
            panic!("{timed_out}\n{}", self.log_tails());
        }
    }

    /// Waits until no node lists `user`'s `device` as online (`GET /v1/users/{user}/presence`):
    /// the server has noticed the connection is gone.
    pub async fn wait_until_offline(&self, user: &str, device: &str) {
        let offline = poll().within(WAIT).every(Duration::from_millis(20));
        if let Err(timed_out) = offline
            .try_until(&format!("{user}/{device} offline"), async || !self.is_online(0, user, device).await)
            .await
        {
            panic!("{timed_out}\n{}", self.log_tails());
        }
    }

    /// SIGTERM of node `at`, as a service manager stops it: it drains (`go_away` to every
    /// client) and exits; waits for that and checks it exited cleanly.
    pub async fn terminate(&mut self, at: usize) {
        match self {
            Self::One(herald) => assert!(herald.terminate().await, "the node exits cleanly\n{}", herald.log_tail()),
            Self::Three(nodes) => nodes.terminate(at).await,
        }
    }

    /// Starts node `at` again on its data (on one node, on a new port).
    pub async fn restart(&mut self, at: usize) {
        match self {
            Self::One(herald) => herald.restart().await,
            Self::Three(nodes) => nodes.restart(at).await,
        }
    }

    /// The node whose client URL is `url`, if one is.
    pub fn node_at(&self, url: &str) -> Option<usize> {
        (0..self.count()).find(|&at| self.node(at).ws_url() == url)
    }

    /// How many nodes there are.
    pub fn count(&self) -> usize {
        if self.is_cluster() { 3 } else { 1 }
    }

    /// Whether any node lists `user`'s `device` as online, asked of node `at`.
    pub async fn is_online(&self, at: usize, user: &str, device: &str) -> bool {
        self.presence(at, user).await["devices"]
            .as_array()
            .is_some_and(|devices| devices.iter().any(|entry| entry["device"] == device))
    }

    /// `GET /v1/users/{user}/presence` of node `at`, asked again after a 503 (the route
    /// table did not answer in time, as it may not on a loaded machine) as a client would.
    pub async fn presence(&self, at: usize, user: &str) -> serde_json::Value {
        let presence = poll()
            .within(WAIT)
            .every(Duration::from_millis(20))
            .until("presence answered without a 503", async || {
                let presence = self.node(at).get(&format!("/v1/users/{user}/presence"), Some(DEV_KEY)).await;
                if presence.status == 503 { Err(format!("{presence:?}")) } else { Ok(presence) }
            })
            .await;
        assert_eq!(presence.status, 200, "{presence:?}");
        presence.json()
    }

    /// The Prometheus sample `series` summed over every node.
    pub async fn total(&self, series: &str) -> f64 {
        match self {
            Self::One(herald) => herald.metric(series).await,
            Self::Three(nodes) => nodes.total(series).await,
        }
    }

    /// How many backfills every node together ran by `path` (`full` or `resumed`), as
    /// their `/metrics` count them.
    pub async fn backfills(&self, path: &str) -> f64 {
        self.total(&format!(r#"herald_delivery_backfills_total{{path="{path}"}}"#)).await
    }

    /// Waits until no node has a backfill under way
    /// (`herald_delivery_backfills_unfinished`): a connection is resumed from only once its
    /// own backfill is over, so a scenario about resuming lets it end before the drop.
    pub async fn wait_until_backfills_over(&self) {
        let over = poll().within(WAIT).every(Duration::from_millis(20));
        let outcome = over
            .try_until("every backfill to end", async || match self {
                Self::One(herald) => herald.backfills_over().await,
                Self::Three(nodes) => nodes.backfills_over().await,
            })
            .await;
        if let Err(timed_out) = outcome {
            panic!("{timed_out}\n{}", self.log_tails());
        }
    }

    /// The last log lines of every node.
    pub fn log_tails(&self) -> String {
        match self {
            Self::One(herald) => herald.log_tail(),
            Self::Three(nodes) => nodes.log_tails(),
        }
    }

    /// Stops every node and drops what the topology created.
    pub async fn stop(self) {
        match self {
            Self::One(mut herald) => herald.kill9(),
            Self::Three(nodes) => nodes.stop().await,
        }
    }
}

/// Generates, for each `async fn(Topology)` scenario, one test on one embedded node and one
/// on three cluster nodes on each of PostgreSQL and MariaDB.
#[macro_export]
macro_rules! on_both_topologies {
    ($($scenario:ident),* $(,)?) => {
        mod one_node {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() { super::$scenario($crate::messaging::world::Topology::OneNode).await }
            )*
        }
        mod three_nodes_on_postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario($crate::messaging::world::Topology::ThreeNodes(
                    herald_host::store::Backend::Postgres,
                ))
                .await
            }
            )*
        }
        mod three_nodes_on_mariadb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario($crate::messaging::world::Topology::ThreeNodes(herald_host::store::Backend::MySql))
                    .await
            }
            )*
        }
    };
}
