//! The soak's samples: the server process's resident memory and open file descriptors
//! (from `/proc/PID`), and from its `/metrics` the live tokio tasks and the size of every
//! map it reports (`herald_map_entries{map}`, whatever maps appear), plus the gateway's
//! connection gauges. Series are named by what they hold; a series the server does not
//! report is simply absent from a sample.

use std::{collections::BTreeMap, fmt::Write as _, path::Path, time::Duration};

use crate::{http, metrics::Scrape};

/// Resident memory of the server, MiB.
pub const RSS: &str = "rss_mib";
/// Open file descriptors of the server.
pub const FDS: &str = "fds";
/// Live tokio tasks of the server (`herald_runtime_alive_tasks`).
pub const TASKS: &str = "tasks";
/// Prefix of the series of `herald_map_entries{map="…"}`.
pub const MAP_PREFIX: &str = "map_";
/// `herald_gateway_connections`.
pub const GATEWAY_CONNECTIONS: &str = "gateway_connections";
/// `herald_gateway_parked`.
pub const GATEWAY_PARKED: &str = "gateway_parked";

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Time into the soak.
    pub at: Duration,
    /// Taken within a reconnect storm's settling time: kept in the CSV, left out of the fit.
    pub storm: bool,
    /// Clients connected at the time, as the soak counts them.
    pub clients: usize,
    /// Messages pushed to the soak's clients so far (the load behind the series: the
    /// server holds a retry timer per recent push, counted in its live tasks).
    pub delivered: u64,
    /// Every series read, by name.
    pub values: BTreeMap<String, f64>,
}

/// What went wrong reading the server's figures.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// `/proc/PID` could not be read: the process is gone, or not on this machine.
    #[error("cannot read /proc/{pid} (has the server exited?): {source}")]
    Proc {
        /// The process id.
        pid: u32,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// `/metrics` did not answer.
    #[error("GET /metrics failed: {0}")]
    Metrics(String),
}

/// Reads the figures of one server process.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// The server's process id.
    pub pid: u32,
    /// The server's `host:port`.
    pub authority: String,
}

impl Sampler {
    /// Reads every series now.
    ///
    /// # Errors
    ///
    /// [`SampleError`] when `/proc` or `/metrics` cannot be read.
    pub async fn read(&self) -> Result<BTreeMap<String, f64>, SampleError> {
        let pid = self.pid;
        let process = tokio::task::spawn_blocking(move || read_proc(pid))
            .await
            .map_err(|error| SampleError::Proc { pid, source: std::io::Error::other(error.to_string()) })??;
        let answer = http::request(&self.authority, "GET", "/metrics", None, None, Duration::from_secs(10))
            .await
            .map_err(|error| SampleError::Metrics(error.to_string()))?;
        if !answer.is_success() {
            return Err(SampleError::Metrics(format!("status {}", answer.status)));
        }
        let mut values = series_of(&Scrape::parse(&answer.body));
        values.insert(RSS.to_owned(), process.0);
        values.insert(FDS.to_owned(), process.1);
        Ok(values)
    }
}

/// RSS in MiB and the count of open fds of process `pid`.
fn read_proc(pid: u32) -> Result<(f64, f64), SampleError> {
    let proc_error = |source| SampleError::Proc { pid, source };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(proc_error)?;
    let rss_kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| proc_error(std::io::Error::other("no VmRSS line")))?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(proc_error)?.count();
    Ok((rss_kib / 1024.0, fds as f64))
}

/// The series the soak follows, out of one `/metrics` scrape.
pub fn series_of(scrape: &Scrape) -> BTreeMap<String, f64> {
    let mut values = BTreeMap::new();
    if let Some(tasks) = scrape.value("herald_runtime_alive_tasks", &[]) {
        values.insert(TASKS.to_owned(), tasks);
    }
    for series in scrape.named("herald_map_entries") {
        if let Some(map) = series.label("map") {
            *values.entry(format!("{MAP_PREFIX}{map}")).or_default() += series.value;
        }
    }
    for (name, metric) in
        [(GATEWAY_CONNECTIONS, "herald_gateway_connections"), (GATEWAY_PARKED, "herald_gateway_parked")]
    {
        if let Some(value) = scrape.value(metric, &[]) {
            values.insert(name.to_owned(), value);
        }
    }
    values
}

/// Every series name that appears in any sample, in a stable order: RSS, fds, tasks, then
/// the rest by name.
pub fn series_names(samples: &[Sample]) -> Vec<String> {
    let mut names: Vec<String> = samples.iter().flat_map(|sample| sample.values.keys().cloned()).collect();
    names.sort_by_key(|name| {
        let rank = [RSS, FDS, TASKS].iter().position(|first| name == first).unwrap_or(3);
        (rank, name.clone())
    });
    names.dedup();
    names
}

/// The samples as CSV: `elapsed_s,storm,clients,delivered`, then one column per series (empty where a
/// sample lacks it).
pub fn to_csv(samples: &[Sample]) -> String {
    let names = series_names(samples);
    let mut csv = String::from("elapsed_s,storm,clients,delivered");
    for name in &names {
        let _ = write!(csv, ",{name}");
    }
    csv.push('\n');
    for sample in samples {
        let _ = write!(
            csv,
            "{:.1},{},{},{}",
            sample.at.as_secs_f64(),
            u8::from(sample.storm),
            sample.clients,
            sample.delivered
        );
        for name in &names {
            match sample.values.get(name) {
                Some(value) => {
                    let _ = write!(csv, ",{}", round(*value));
                }
                None => csv.push(','),
            }
        }
        csv.push('\n');
    }
    csv
}

/// Writes [`to_csv`] to `path`.
///
/// # Errors
///
/// The file's write error.
pub async fn write_csv(path: &Path, samples: &[Sample]) -> std::io::Result<()> {
    let (path, csv) = (path.to_path_buf(), to_csv(samples));
    tokio::task::spawn_blocking(move || std::fs::write(path, csv)).await.map_err(std::io::Error::other)?
}

/// A value with at most three decimals, without trailing zeros.
fn round(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_read_generically_from_metrics() {
        let scrape = Scrape::parse(
            "herald_runtime_alive_tasks 412\nherald_map_entries{map=\"routes\"} 90\n\
             herald_map_entries{map=\"lanes\"} 12\nherald_gateway_connections 88\nherald_other 1\n",
        );
        let values = series_of(&scrape);
        assert_eq!(values.get(TASKS), Some(&412.0));
        assert_eq!(values.get("map_routes"), Some(&90.0));
        assert_eq!(values.get("map_lanes"), Some(&12.0));
        assert_eq!(values.get(GATEWAY_CONNECTIONS), Some(&88.0));
        assert_eq!(values.len(), 4);
        assert!(series_of(&Scrape::default()).is_empty());
    }

    #[test]
    fn csv_has_a_column_per_series_seen() {
        let first = Sample {
            at: Duration::from_secs(10),
            storm: false,
            clients: 3,
            delivered: 700,
            values: [(RSS.to_owned(), 101.25), ("map_routes".to_owned(), 3.0)].into(),
        };
        let second = Sample {
            at: Duration::from_secs(20),
            storm: true,
            clients: 0,
            delivered: 900,
            values: [(RSS.to_owned(), 102.0), (FDS.to_owned(), 40.0)].into(),
        };
        assert_eq!(
            to_csv(&[first, second]),
            "elapsed_s,storm,clients,delivered,rss_mib,fds,map_routes\n10.0,0,3,700,101.25,,3\n20.0,1,0,900,102,40,\n"
        );
    }

    #[test]
    fn this_process_can_be_read() {
        let (rss, fds) = read_proc(std::process::id()).expect("reads /proc/self");
        assert!(rss > 0.0 && fds > 0.0);
    }
}
