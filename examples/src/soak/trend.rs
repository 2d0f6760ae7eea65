//! The soak's decision, as pure arithmetic: a least-squares line through one series'
//! steady samples, and whether the growth that line projects over the steady window stays
//! within a tolerance of `relative × mean + absolute`.
//!
//! Why a fitted line and not first-vs-last: one noisy sample at either end (a GC-like
//! allocator hand-back, a burst of connections) would decide alone; the fit weighs every
//! sample. Why a tolerance with both parts: the relative part scales with the series (a
//! 200 MiB RSS may wander by megabytes), the absolute part keeps tiny series (3 open
//! connections) from failing on a single step.

use std::{fmt, str::FromStr};

/// A straight line `value = intercept + slope × t`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    /// Change of the value per unit of `t`.
    pub slope: f64,
    /// The value at `t = 0`.
    pub intercept: f64,
}

/// The least-squares line through `points` (`(t, value)`), or `None` with fewer than two
/// points or when every `t` is the same.
pub fn fit(points: &[(f64, f64)]) -> Option<Line> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mean_t = points.iter().map(|(t, _)| t).sum::<f64>() / n;
    let mean_v = points.iter().map(|(_, v)| v).sum::<f64>() / n;
    let (mut covariance, mut variance) = (0.0, 0.0);
    for (t, v) in points {
        covariance += (t - mean_t) * (v - mean_v);
        variance += (t - mean_t) * (t - mean_t);
    }
    if variance <= f64::EPSILON {
        return None;
    }
    let slope = covariance / variance;
    Some(Line { slope, intercept: mean_v - slope * mean_t })
}

/// How much a series may grow over the steady window: `relative × mean + absolute`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Share of the series' mean (0.1 = 10 %).
    pub relative: f64,
    /// In the series' own unit (MiB, fds, entries).
    pub absolute: f64,
}

impl Tolerance {
    /// The growth allowed for a series whose steady mean is `mean`.
    pub fn allowed(self, mean: f64) -> f64 {
        self.relative * mean.abs() + self.absolute
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%+{}", self.relative * 100.0, self.absolute)
    }
}

impl FromStr for Tolerance {
    type Err = String;

    /// Parses `REL%+ABS` (`10%+8`), or either part alone (`10%`, `8`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{text}` is not a tolerance: use e.g. 10%+8 (10 % of the mean plus 8 units)");
        let mut tolerance = Self { relative: 0.0, absolute: 0.0 };
        for part in text.split('+').map(str::trim) {
            if let Some(percent) = part.strip_suffix('%') {
                tolerance.relative = percent.trim().parse::<f64>().map_err(|_| bad())? / 100.0;
            } else {
                tolerance.absolute = part.parse().map_err(|_| bad())?;
            }
        }
        if tolerance.relative < 0.0 || tolerance.absolute < 0.0 || !tolerance.relative.is_finite() {
            return Err(bad());
        }
        Ok(tolerance)
    }
}

/// One series' figures over the steady window.
#[derive(Debug, Clone, PartialEq)]
pub struct Trend {
    /// Samples in the window.
    pub samples: usize,
    /// The first steady sample.
    pub first: f64,
    /// The last steady sample.
    pub last: f64,
    /// Mean over the window.
    pub mean: f64,
    /// Fitted change per minute.
    pub slope_per_minute: f64,
    /// Length of the window in minutes.
    pub window_minutes: f64,
    /// What the fitted line gains over the window: `slope × window`.
    pub growth: f64,
    /// The growth the tolerance allows.
    pub allowed: f64,
}

impl Trend {
    /// Fits `points` (`(minutes, value)`, the steady samples only) and compares the growth
    /// with `tolerance`. `None` with fewer than three samples: too few to speak of a trend.
    pub fn of(points: &[(f64, f64)], tolerance: Tolerance) -> Option<Self> {
        if points.len() < 3 {
            return None;
        }
        let line = fit(points)?;
        let (first, last) = (points[0], points[points.len() - 1]);
        let mean = points.iter().map(|(_, v)| v).sum::<f64>() / points.len() as f64;
        let window_minutes = last.0 - first.0;
        let growth = line.slope * window_minutes;
        Some(Self {
            samples: points.len(),
            first: first.1,
            last: last.1,
            mean,
            slope_per_minute: line.slope,
            window_minutes,
            growth,
            allowed: tolerance.allowed(mean),
        })
    }

    /// The growth as a share of the mean, in percent (0 when the mean is 0 and nothing grew).
    pub fn growth_percent(&self) -> f64 {
        if self.mean.abs() > f64::EPSILON {
            100.0 * self.growth / self.mean.abs()
        } else if self.growth.abs() > f64::EPSILON {
            f64::INFINITY.copysign(self.growth)
        } else {
            0.0
        }
    }

    /// Whether the series grew by more than its tolerance. Shrinking never fails.
    pub fn grows(&self) -> bool {
        self.growth > self.allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_slope_of_a_known_line_is_found() {
        let points: Vec<(f64, f64)> = (0..20).map(|i| (f64::from(i), 3.0 + 0.5 * f64::from(i))).collect();
        let line = fit(&points).expect("fits");
        assert!(close(line.slope, 0.5), "{line:?}");
        assert!(close(line.intercept, 3.0), "{line:?}");
        assert_eq!(fit(&points[..1]), None);
        assert_eq!(fit(&[(1.0, 2.0), (1.0, 5.0)]), None);
    }

    #[test]
    fn a_flat_noisy_series_passes() {
        // ±2 MiB of deterministic noise around 100 MiB, 30 samples over 29 minutes.
        let noise = [1.7, -0.4, 0.9, -1.8, 0.2, 1.1, -1.3, 0.5, -0.7, 1.9];
        let points: Vec<(f64, f64)> = (0..30).map(|i| (f64::from(i), 100.0 + noise[i as usize % 10])).collect();
        let trend = Trend::of(&points, Tolerance { relative: 0.10, absolute: 8.0 }).expect("enough samples");
        assert!(!trend.grows(), "{trend:?}");
        assert!(trend.growth.abs() < 2.0, "{trend:?}");
        assert!(close(trend.window_minutes, 29.0));
    }

    #[test]
    fn a_growing_series_fails() {
        // 1 MiB a minute for 30 minutes on 100 MiB: +30 % against 10 % + 8 MiB allowed.
        let points: Vec<(f64, f64)> = (0..31).map(|i| (f64::from(i), 100.0 + f64::from(i))).collect();
        let trend = Trend::of(&points, Tolerance { relative: 0.10, absolute: 8.0 }).expect("enough samples");
        assert!(trend.grows(), "{trend:?}");
        assert!(close(trend.slope_per_minute, 1.0));
        assert!(close(trend.growth, 30.0));
        assert!((trend.growth_percent() - 26.08).abs() < 0.01, "{}", trend.growth_percent());
    }

    #[test]
    fn a_shrinking_series_and_a_short_one_pass() {
        let points: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), 50.0 - f64::from(i))).collect();
        assert!(!Trend::of(&points, Tolerance { relative: 0.0, absolute: 0.0 }).expect("fits").grows());
        assert_eq!(Trend::of(&points[..2], Tolerance { relative: 0.0, absolute: 0.0 }), None);
    }

    #[test]
    fn tolerances_parse() {
        assert_eq!("10%+8".parse(), Ok(Tolerance { relative: 0.10, absolute: 8.0 }));
        assert_eq!("5 % + 16".parse(), Ok(Tolerance { relative: 0.05, absolute: 16.0 }));
        assert_eq!("25%".parse(), Ok(Tolerance { relative: 0.25, absolute: 0.0 }));
        assert_eq!("32".parse(), Ok(Tolerance { relative: 0.0, absolute: 32.0 }));
        assert!("ten".parse::<Tolerance>().is_err());
        assert!("-5%".parse::<Tolerance>().is_err());
        assert!(close(Tolerance { relative: 0.1, absolute: 8.0 }.allowed(100.0), 18.0));
    }
}
