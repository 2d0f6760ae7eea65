//! `herald`: the command line. `serve` runs a node, `migrate` brings a database's schema up
//! to date and exits.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[path = "cli/registry.rs"]
mod registry_cli;
use herald_host::config::{Config, Overrides};
use herald_host::server;
use herald_host::store::Database;
use tracing_subscriber::EnvFilter;

/// mimalloc, and each runtime worker hands freed memory back to the OS as it goes idle
/// (`herald_alloc`'s docs say why); it counts allocations with `serve --count-allocations`.
#[global_allocator]
static ALLOCATOR: herald_alloc::Counting = herald_alloc::Counting;

/// Herald: instant messaging whose policies are sandboxed Wasm plugins.
#[derive(Parser, Debug)]
#[command(name = "herald", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a Herald node: cluster mode when `cluster.redis_url` is set (with a MySQL/MariaDB
    /// or PostgreSQL database every node shares), embedded mode (SQLite) otherwise.
    Serve(ServeArgs),
    /// Apply database migrations and exit (`serve` also applies them on start).
    Migrate(CommonArgs),
    /// Write or check plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Tools for a cluster of nodes.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Print an nginx config that sends each user's connections to its home node
    /// (cluster.placement), made from a live node's view of the cluster.
    NginxConf {
        /// A live node's HTTP address, e.g. http://10.0.0.1:7070.
        #[arg(long)]
        url: String,
        /// An admin key of that node.
        #[arg(long, env = "HERALD_ADMIN_KEY")]
        key: String,
        /// nginx's `listen` directive (`80`, `0.0.0.0:8080`).
        #[arg(long, default_value = "80")]
        listen: String,
    },
}

#[derive(Subcommand, Debug)]
enum PluginCommand {
    /// Load a plugin, list its hooks and contract version, and run each hook once.
    Check {
        /// The plugin's .wasm file (its manifest NAME.toml may sit beside it).
        file: PathBuf,
    },
    /// Run a recording (`POST /admin/plugins/NAME/recording`) through a plugin and print
    /// every decision that differs from the recorded one; exits non-zero when any does.
    Replay {
        /// The plugin's .wasm file (its manifest NAME.toml may sit beside it).
        plugin: PathBuf,
        /// The recording, a JSON-lines file.
        recording: PathBuf,
        /// Print the whole report as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Upload a plugin version to the registry of a running cluster (or embedded node):
    /// checked there before it is stored (PUT /admin/plugins/NAME/versions/VERSION).
    Push {
        /// The plugin's .wasm file.
        file: PathBuf,
        /// Its manifest; the name and version come from it unless given below.
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// The plugin's name (default: the manifest's, else the file's stem).
        #[arg(long)]
        name: Option<String>,
        /// The version (default: the manifest's).
        #[arg(long)]
        version: Option<String>,
        /// A node's HTTP URL, e.g. http://127.0.0.1:7070.
        #[arg(long, env = "HERALD_URL")]
        url: String,
        /// An admin key.
        #[arg(long, env = "HERALD_ADMIN_KEY")]
        key: String,
    },
    /// Deploy an uploaded version on every node, as the active version or (--shadow) as
    /// its shadow; answers once every node switched, or names the node that could not.
    Deploy {
        /// The plugin's name.
        name: String,
        /// The version to deploy.
        version: String,
        /// Deploy it as the shadow of the active version.
        #[arg(long)]
        shadow: bool,
        /// A node's HTTP URL, e.g. http://127.0.0.1:7070.
        #[arg(long, env = "HERALD_URL")]
        url: String,
        /// An admin key.
        #[arg(long, env = "HERALD_ADMIN_KEY")]
        key: String,
    },
    /// Scaffold a new plugin crate that builds against herald-sdk.
    ///
    /// By default the SDK this binary carries is written into the new crate's `herald-sdk/`
    /// folder, so the crate builds anywhere, offline. Or name another SDK: a folder, a git
    /// repository, or a registry version.
    New {
        /// The plugin's name (a crate name, e.g. `word-filter`).
        name: String,
        /// Folder to create it in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Use the herald-sdk crate in this folder (e.g. a Herald checkout's `sdk/`).
        #[arg(long, value_name = "DIR", conflicts_with_all = ["sdk_git", "sdk_version"])]
        sdk_path: Option<PathBuf>,
        /// Use herald-sdk from this git repository (the Herald workspace).
        #[arg(long, value_name = "URL", conflicts_with = "sdk_version")]
        sdk_git: Option<String>,
        /// With --sdk-git: the branch, tag or commit.
        #[arg(long, value_name = "REV", requires = "sdk_git")]
        sdk_rev: Option<String>,
        /// Use herald-sdk from the registry, at this version requirement (e.g. `0.1`).
        #[arg(long, value_name = "REQ")]
        sdk_version: Option<String>,
    },
}

/// Flags shared by every command. Each may also be set in the config file or as a
/// `HERALD_*` environment variable; flags win.
#[derive(Args, Debug)]
struct CommonArgs {
    /// TOML config file.
    #[arg(long, env = "HERALD_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Where embedded mode keeps its data [default: ./herald-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Folder of .wasm plugins [default: <data-dir>/plugins].
    #[arg(long, value_name = "DIR")]
    plugins: Option<PathBuf>,
    /// Dev mode: loopback only, `dev:<user>` tokens and `dev-key` accepted.
    #[arg(long)]
    dev: bool,
}

/// `serve`'s flags.
#[derive(Args, Debug)]
struct ServeArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Count every allocation, the bytes asked for and the bytes freed, exported at
    /// /metrics as herald_allocations_total, herald_allocated_bytes_total and
    /// herald_heap_live_bytes (for benchmarks: it costs a few nanoseconds per allocation).
    #[arg(long)]
    count_allocations: bool,
    /// Once the node accepts connections, write the address it listens on (`IP:PORT` and a
    /// newline) to FILE, replacing it whole: with `--listen 127.0.0.1:0`, the port the
    /// system picked, for whatever starts the node to read.
    #[arg(long, value_name = "FILE")]
    listen_file: Option<PathBuf>,
}

impl CommonArgs {
    fn load(&self) -> anyhow::Result<Config> {
        let flags = Overrides {
            listen: self.listen,
            data_dir: self.data_dir.clone(),
            plugins: self.plugins.clone(),
            dev: self.dev,
        };
        Ok(Config::load(self.config.as_deref(), &flags)?)
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")))
        .init();
    let cli = Cli::parse();
    let outcome = match cli.command {
        // The node's configuration sizes its runtime, so it is read first.
        Command::Serve(args) => args.common.load().and_then(|config| {
            runtime(config.worker_threads).and_then(|runtime| runtime.block_on(serve(&args, &config)))
        }),
        Command::Migrate(args) => runtime(0).and_then(|runtime| runtime.block_on(migrate(&args))),
        Command::Plugin(command) => runtime(0).and_then(|runtime| runtime.block_on(plugin(command))),
        Command::Cluster(command) => runtime(1).and_then(|runtime| runtime.block_on(cluster(command))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("herald: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The async runtime: `worker_threads` threads, or one per core when 0. Each worker hands
/// its idle memory back as it parks (`herald_alloc`).
fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder
        .enable_all()
        .on_thread_park(herald_alloc::collect_when_due)
        .build()
        .map_err(|error| anyhow::anyhow!("cannot start the async runtime: {error}"))
}

/// `herald serve`: runs the node until a signal, or until it lost its cluster lease.
async fn serve(args: &ServeArgs, config: &Config) -> anyhow::Result<()> {
    if args.count_allocations {
        herald_alloc::start_counting();
    }
    let running = server::start(config).await?;
    if let Some(file) = &args.listen_file
        && let Err(error) = write_listen_file(file.clone(), running.addr).await
    {
        running.shutdown().await;
        anyhow::bail!("cannot write the address it listens on to {}: {error}", file.display());
    }
    let lost = tokio::select! {
        () = shutdown_signal() => false,
        () = running.must_stop() => true,
    };
    tracing::info!("shutting down");
    running.shutdown().await;
    if lost {
        anyhow::bail!(
            "this node's cluster lease was lost (it was paused or cut off from Redis for longer than \
             cluster.lease_ttl_ms), so it stopped rather than act for conversations another node may own now; \
             start it again and it joins as a new member"
        );
    }
    Ok(())
}

/// Writes `addr` to `file` through a temporary file beside it, renamed over it: a reader
/// never finds it half written.
async fn write_listen_file(file: PathBuf, addr: SocketAddr) -> std::io::Result<()> {
    tokio::task::spawn_blocking(move || {
        let name = file.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let partial = file.with_file_name(format!(".{name}.partial"));
        std::fs::write(&partial, format!("{addr}\n"))?;
        std::fs::rename(&partial, &file)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// `herald plugin …`.
async fn plugin(command: PluginCommand) -> anyhow::Result<()> {
    match command {
        PluginCommand::Check { file } => {
            let report = herald_plugin_runtime::check(&file).await?;
            print_report(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        PluginCommand::Push { file, manifest, name, version, url, key } => {
            print_report(&registry_cli::push(&file, manifest.as_deref(), name, version, &url, &key).await?);
            Ok(())
        }
        PluginCommand::Deploy { name, version, shadow, url, key } => {
            print_report(&registry_cli::deploy(&name, &version, shadow, &url, &key).await?);
            Ok(())
        }
        PluginCommand::Replay { plugin, recording, json } => {
            let report = herald_plugin_runtime::replay(&plugin, &recording).await?;
            if json {
                print_report(&serde_json::to_string_pretty(&report)?);
            } else {
                print_report(&replay_text(&report));
            }
            match report.differences.len() {
                0 => Ok(()),
                n => anyhow::bail!("{n} of {} replayed decisions differ from the recording", report.replayed),
            }
        }
        PluginCommand::New { name, dir, sdk_path, sdk_git, sdk_rev, sdk_version } => {
            use herald_plugin_runtime::SdkDependency;
            let sdk = match (sdk_path, sdk_git, sdk_version) {
                (Some(path), _, _) => SdkDependency::Path(path),
                (_, Some(url), _) => SdkDependency::Git { url, rev: sdk_rev },
                (_, _, Some(requirement)) => SdkDependency::Version(requirement),
                _ => SdkDependency::Bundled,
            };
            let created = herald_plugin_runtime::scaffold(&name, &dir, &sdk)?;
            eprintln!(
                "herald: created {}; build it with: cargo build --target wasm32-wasip2 --release --manifest-path {}/Cargo.toml",
                created.display(),
                created.display()
            );
            Ok(())
        }
    }
}

/// `herald cluster …`.
#[allow(clippy::print_stdout, reason = "the command's output")]
async fn cluster(command: ClusterCommand) -> anyhow::Result<()> {
    use herald_host::cluster::nginx_conf::{Frontend, fetch, render};
    match command {
        ClusterCommand::NginxConf { url, key, listen } => {
            let cluster = fetch(&url, &key).await?;
            print!("{}", render(&cluster, &Frontend { listen, source: url })?);
        }
    }
    Ok(())
}

/// `herald migrate`.
async fn migrate(args: &CommonArgs) -> anyhow::Result<()> {
    let config = args.load()?;
    let database = Database::connect(&config.database_url(), &config.storage).await?;
    let count = database.migrate().await?;
    eprintln!("herald: schema of {:?} database is up to date ({count} migrations)", database.backend());
    database.close().await;
    Ok(())
}

/// A replay report for people: what was replayed, then each difference on a few lines.
fn replay_text(report: &herald_plugin_runtime::ReplayReport) -> String {
    use std::fmt::Write;
    let header = &report.recording;
    let mut text = format!(
        "recording of {} {} ({}, contract {}), {} records; replayed through {} {} ({})\n\
         {} replayed, {} skipped (hooks the plugin does not export), {} differ\n",
        header.plugin,
        header.version,
        header.content_hash,
        header.contract,
        report.records,
        report.plugin,
        report.version,
        report.content_hash,
        report.replayed,
        report.skipped,
        report.differences.len(),
    );
    if header.redacted_bodies {
        text.push_str("(bodies were redacted when recorded: the plugin saw them empty)\n");
    }
    for difference in &report.differences {
        let input = serde_json::to_string(&difference.call).unwrap_or_default();
        let recorded = serde_json::to_string(&difference.recorded).unwrap_or_default();
        let replayed = serde_json::to_string(&difference.replayed).unwrap_or_default();
        let _ = write!(
            text,
            "\nline {}: {}\n  input:    {input}\n  recorded: {recorded}\n  now:      {replayed}\n",
            difference.line,
            difference.call.hook(),
        );
    }
    text
}

/// The CLI's answer goes to stdout, where a script can read it.
#[allow(clippy::print_stdout, reason = "the command's output")]
fn print_report(text: &str) {
    println!("{text}");
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => return interrupt.await.unwrap_or(()),
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
