//! Reading a server's `GET /metrics` answer (the Prometheus text format) into series the
//! tools can look up by name and labels.
//!
//! Only what the tools need: sample lines `name{label="value",…} number [timestamp]`;
//! comments (`# TYPE`, `# HELP`) and lines that do not parse are skipped, so a server adding
//! series never breaks a reader.

/// One sample line of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The metric name, e.g. `herald_gateway_connections`.
    pub name: String,
    /// Its labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The sample value.
    pub value: f64,
}

impl Series {
    /// The value of label `name`, if the series has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(label, _)| label == name).map(|(_, value)| value.as_str())
    }
}

/// Every sample line of one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// The series in the order the server wrote them.
    pub series: Vec<Series>,
}

impl Scrape {
    /// Parses a Prometheus text exposition.
    pub fn parse(text: &str) -> Self {
        Self { series: text.lines().filter_map(parse_line).collect() }
    }

    /// The series named `name`, whatever their labels.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |series| series.name == name)
    }

    /// The value of the series `name` whose labels include every pair of `labels` (the first
    /// such series), or `None` when there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.named(name)
            .find(|series| labels.iter().all(|(label, value)| series.label(label) == Some(value)))
            .map(|series| series.value)
    }
}

/// Parses one sample line; `None` for comments, blank lines and anything malformed.
fn parse_line(line: &str) -> Option<Series> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end + 1..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(Series { name: name.to_owned(), labels, value })
}

/// Parses `a="x",b="y"}` (the text after the opening brace); returns the labels and what
/// follows the closing brace.
fn parse_labels(mut text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (name, rest) = text.split_once('=')?;
        let mut chars = rest.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (at, '"') => break at,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, other) => value.push(other),
            }
        };
        labels.push((name.trim().to_owned(), value));
        text = &rest[1 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
# TYPE herald_gateway_connections gauge
herald_gateway_connections 2
herald_map_entries{map="routes"} 17
herald_map_entries{map="dedup_marks"} 1.5e3
herald_delivery_backfills_total{path="full"} 4 1700000000000
herald_odd{a="x\"y",b="back\\slash"} +Inf
not a sample line
"#;

    #[test]
    fn sample_lines_parse_with_their_labels() {
        let scrape = Scrape::parse(TEXT);
        assert_eq!(scrape.value("herald_gateway_connections", &[]), Some(2.0));
        assert_eq!(scrape.value("herald_map_entries", &[("map", "routes")]), Some(17.0));
        assert_eq!(scrape.value("herald_map_entries", &[("map", "dedup_marks")]), Some(1500.0));
        assert_eq!(scrape.value("herald_delivery_backfills_total", &[("path", "full")]), Some(4.0));
        assert_eq!(scrape.value("herald_map_entries", &[("map", "lanes")]), None);
        let odd = scrape.named("herald_odd").next().expect("parsed");
        assert_eq!(odd.label("a"), Some("x\"y"));
        assert_eq!(odd.label("b"), Some("back\\slash"));
        assert_eq!(odd.value, f64::INFINITY);
        assert_eq!(scrape.series.len(), 5, "the line that is not a sample is skipped");
    }

    #[test]
    fn every_label_value_of_a_name_is_listed() {
        let scrape = Scrape::parse(TEXT);
        let maps: Vec<&str> = scrape.named("herald_map_entries").filter_map(|s| s.label("map")).collect();
        assert_eq!(maps, ["routes", "dedup_marks"]);
    }
}
