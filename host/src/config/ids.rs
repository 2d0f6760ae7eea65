//! `[ids]`: how message ids resume after a restart. Checked with the rest in
//! [`Config::validate`](super::Config::validate).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most `max_clock_wait_ms` may be: a node that would wait longer for its clock has a
/// clock to fix, not to wait for.
pub const MAX_CLOCK_WAIT: Duration = Duration::from_secs(600);

/// `[ids]`: snowflake message ids.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdsConfig {
    /// At start, a node whose clock is behind the newest message id its node id committed
    /// before (its clock was stepped back, or the id was last leased by a machine whose
    /// clock ran ahead) waits up to this long for the clock to pass it, so no id it issues
    /// sorts below one already stored. Further behind, it refuses to start. 0: refuse
    /// whenever the clock is behind.
    #[serde(rename = "max_clock_wait_ms", with = "super::millis")]
    pub max_clock_wait: Duration,
}

impl Default for IdsConfig {
    fn default() -> Self {
        // Covers the step an NTP daemon makes at boot on a machine whose clock drifted
        // while it was off, without holding a start-up up for long.
        Self { max_clock_wait: Duration::from_secs(5) }
    }
}

impl IdsConfig {
    /// Checks the bounds.
    ///
    /// # Errors
    /// A message naming the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_clock_wait > MAX_CLOCK_WAIT {
            return Err(format!(
                "ids.max_clock_wait_ms {} must be at most {}; a clock that far behind needs correcting (NTP)",
                self.max_clock_wait.as_millis(),
                MAX_CLOCK_WAIT.as_millis()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_past_the_bound_is_refused_naming_the_setting() {
        assert!(IdsConfig::default().validate().is_ok());
        let error = IdsConfig { max_clock_wait: MAX_CLOCK_WAIT + Duration::from_millis(1) }
            .validate()
            .expect_err("past the bound");
        assert!(error.starts_with("ids.max_clock_wait_ms 600001 must be at most 600000"), "{error}");
    }
}
