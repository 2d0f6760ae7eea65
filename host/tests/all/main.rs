//! Herald's integration tests, in one binary to save link time. Storage tests run against
//! every backend for real: a temporary SQLite file, and fresh databases on the machine's
//! MariaDB and PostgreSQL (see `support`).

mod allocator;
mod cli;
mod cluster;
mod cluster_membership;
mod cluster_plugin_state;
mod defaults;
mod fencing;
mod id_marks;
mod in_process;
mod layering;
mod messaging;
mod nginx;
mod peer;
mod placement;
mod redis_scratch;
mod storage;
mod support;
