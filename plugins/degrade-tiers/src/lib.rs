//! `degrade-tiers` (`degrade` hook): thresholds on the health snapshot choose the delivery
//! tier. A tier applies when *any* of its thresholds is reached; the most degraded tier
//! that applies wins. Tiers without thresholds never apply.
//!
//! ```toml
//! hold_ms = 10000            # stay degraded at least this long before stepping down
//!
//! [offline_only]
//! redelivery_ratio = 0.2
//!
//! [no_backfill]
//! cpu_load = 0.85
//! store_latency_p99_ms = 200
//!
//! [pull_only]
//! cpu_load = 0.95
//! send_queue_depth_max = 1000
//! ```
//!
//! Available thresholds: `connections`, `send_queue_depth_p99`, `send_queue_depth_max`,
//! `store_latency_p99_ms`, `redelivery_ratio`, `cpu_load`, `errors_per_second`.
//! `hold_ms` keeps the tier from flapping: the last escalation is remembered in KV.
#![deny(unsafe_code)]

use herald_sdk::{
    Degrade, clock, config, kv, log,
    types::{Health, Tier},
};
use serde::Deserialize;

/// Thresholds of one tier; unset ones do not count.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Open connections.
    pub connections: Option<u64>,
    /// p99 send-queue depth.
    pub send_queue_depth_p99: Option<u32>,
    /// Deepest send queue.
    pub send_queue_depth_max: Option<u32>,
    /// p99 store latency, ms.
    pub store_latency_p99_ms: Option<u32>,
    /// Share of deliveries that are retries.
    pub redelivery_ratio: Option<f32>,
    /// CPU load (1.0 = all cores busy).
    pub cpu_load: Option<f32>,
    /// Errors per second.
    pub errors_per_second: Option<f32>,
}

impl Thresholds {
    fn reached(&self, h: &Health) -> bool {
        fn at<T: PartialOrd>(limit: Option<T>, value: T) -> bool {
            limit.is_some_and(|l| value >= l)
        }
        at(self.connections, h.connections)
            || at(self.send_queue_depth_p99, h.send_queue_depth_p99)
            || at(self.send_queue_depth_max, h.send_queue_depth_max)
            || at(self.store_latency_p99_ms, h.store_latency_p99_ms)
            || at(self.redelivery_ratio, h.redelivery_ratio)
            || at(self.cpu_load, h.cpu_load)
            || at(self.errors_per_second, h.errors_per_second)
    }
}

/// The plugin's configuration.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Minimum time at a degraded tier before stepping down, ms.
    pub hold_ms: u64,
    /// Thresholds for `offline-only`.
    pub offline_only: Thresholds,
    /// Thresholds for `no-backfill`.
    pub no_backfill: Thresholds,
    /// Thresholds for `pull-only`.
    pub pull_only: Thresholds,
}

static SETTINGS: config::Cached<Settings> = config::Cached::new();

fn severity(tier: Tier) -> u8 {
    match tier {
        Tier::Normal => 0,
        Tier::OfflineOnly => 1,
        Tier::NoBackfill => 2,
        Tier::PullOnly => 3,
    }
}

fn tier_of(severity: u8) -> Tier {
    match severity {
        0 => Tier::Normal,
        1 => Tier::OfflineOnly,
        2 => Tier::NoBackfill,
        _ => Tier::PullOnly,
    }
}

/// The tier the thresholds alone choose.
fn measured(settings: &Settings, health: &Health) -> Tier {
    if settings.pull_only.reached(health) {
        Tier::PullOnly
    } else if settings.no_backfill.reached(health) {
        Tier::NoBackfill
    } else if settings.offline_only.reached(health) {
        Tier::OfflineOnly
    } else {
        Tier::Normal
    }
}

const HELD: &str = "held";

/// The plugin.
pub struct DegradeTiers;

impl Degrade for DegradeTiers {
    fn choose_tier(health: Health) -> Tier {
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let tier = measured(&settings, &health);
        if settings.hold_ms == 0 {
            return tier;
        }
        let now = clock::now_ms();
        // `HELD` = "<severity>:<since_ms>", the last escalation.
        let held = kv::get_string(HELD).and_then(|v| {
            let (s, since) = v.split_once(':')?;
            Some((s.parse::<u8>().ok()?, since.parse::<u64>().ok()?))
        });
        match held {
            Some((s, since)) if s > severity(tier) && now.saturating_sub(since) < settings.hold_ms => tier_of(s),
            Some((s, _)) if s == severity(tier) => tier,
            _ => {
                if held.is_some_and(|(s, _)| s < severity(tier)) || tier != Tier::Normal {
                    log::warn("delivery tier changed", &[("tier", &format!("{tier:?}"))]);
                }
                kv::set(HELD, format!("{}:{now}", severity(tier)).as_bytes(), None);
                tier
            }
        }
    }
}

herald_sdk::export_plugin!(DegradeTiers, hooks: [degrade]);

#[cfg(test)]
mod tests {
    use super::*;
    use herald_sdk::testkit::{self, FakeHost};

    const CONFIG: &str = r#"
        [offline_only]
        redelivery_ratio = 0.2
        [no_backfill]
        cpu_load = 0.85
        store_latency_p99_ms = 200
        [pull_only]
        cpu_load = 0.95
        send_queue_depth_max = 1000
    "#;

    fn health(cpu: f32, latency: u32, queue_max: u32, redelivery: f32) -> Health {
        Health {
            cpu_load: cpu,
            store_latency_p99_ms: latency,
            send_queue_depth_max: queue_max,
            redelivery_ratio: redelivery,
            ..testkit::idle_health()
        }
    }

    #[test]
    fn thresholds_pick_the_most_degraded_tier_reached() {
        let _host = FakeHost::new().with_config(CONFIG);
        assert_eq!(DegradeTiers::choose_tier(health(0.5, 10, 10, 0.0)), Tier::Normal);
        assert_eq!(DegradeTiers::choose_tier(health(0.5, 10, 10, 0.25)), Tier::OfflineOnly);
        assert_eq!(DegradeTiers::choose_tier(health(0.5, 250, 10, 0.25)), Tier::NoBackfill);
        assert_eq!(DegradeTiers::choose_tier(health(0.9, 10, 10, 0.0)), Tier::NoBackfill);
        assert_eq!(DegradeTiers::choose_tier(health(0.5, 10, 5000, 0.0)), Tier::PullOnly);
        assert_eq!(DegradeTiers::choose_tier(health(0.99, 10, 10, 0.0)), Tier::PullOnly);
    }

    #[test]
    fn without_thresholds_the_tier_is_normal() {
        let _host = FakeHost::new();
        assert_eq!(DegradeTiers::choose_tier(health(1.0, 10_000, 100_000, 1.0)), Tier::Normal);
    }

    #[test]
    fn hold_keeps_a_degraded_tier_until_it_expires() {
        let host = FakeHost::new().with_config(&format!("hold_ms = 5000\n{CONFIG}"));
        assert_eq!(DegradeTiers::choose_tier(health(0.99, 10, 10, 0.0)), Tier::PullOnly);
        host.advance_ms(1000);
        assert_eq!(DegradeTiers::choose_tier(health(0.1, 10, 10, 0.0)), Tier::PullOnly);
        host.advance_ms(4000);
        assert_eq!(DegradeTiers::choose_tier(health(0.1, 10, 10, 0.0)), Tier::Normal);
        assert_eq!(DegradeTiers::choose_tier(health(0.9, 10, 10, 0.0)), Tier::NoBackfill);
        assert!(!host.logs().is_empty());
    }
}
