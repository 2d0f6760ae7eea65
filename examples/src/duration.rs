//! Human-friendly durations for command lines: `10s`, `500ms`, `1.5s`, `2m`, `1h`, or a
//! bare number of seconds.

use std::time::Duration;

/// Parses a duration such as `10s`, `250ms`, `1.5s`, `2m`, `1h` or `3` (seconds).
///
/// # Errors
///
/// A message naming the accepted forms if `text` is not one of them, is negative, or is too
/// large to represent.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("`{text}` is not a duration: use e.g. 10s, 500ms, 1.5s, 2m"))?;
    let seconds_per_unit = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 0.001,
        "us" | "µs" => 0.000_001,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!("unknown unit `{other}` in `{text}`: use ms, s, m or h"));
        }
    };
    Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|_| format!("`{text}` is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration(" 0s "), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_nonsense() {
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1.2.3s").is_err());
    }
}
