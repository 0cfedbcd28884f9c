//! Metrics as a page, from the descriptions the processes register (the `describe_*`
//! calls that give `/metrics` its `# HELP` lines): a recorder that keeps the
//! descriptions, and a table of them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use crate::markdown::{cell, code, table};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// As `/metrics` types it: histograms are rendered as summaries (quantiles), the
    /// exporter's default, which the processes keep.
    pub fn exposed_as(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "summary",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub name: String,
    pub kind: Kind,
    pub help: String,
}

/// Keeps descriptions; records nothing.
#[derive(Debug, Default)]
struct Descriptions(Mutex<Vec<Described>>);

impl Descriptions {
    fn keep(&self, key: KeyName, kind: Kind, description: SharedString) {
        self.0.lock().unwrap().push(Described {
            name: key.as_str().to_owned(),
            kind,
            help: description.to_string(),
        });
    }
}

impl Recorder for Descriptions {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.keep(key, Kind::Counter, description);
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.keep(key, Kind::Gauge, description);
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.keep(key, Kind::Histogram, description);
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// What `describe` describes, by name. A name described twice alike is one metric;
/// twice differently (two kinds, two texts) is an error, as is an empty text.
pub fn described(describe: impl FnOnce()) -> Result<Vec<Described>, String> {
    let descriptions = Descriptions::default();
    metrics::with_local_recorder(&descriptions, describe);
    let mut by_name: BTreeMap<String, Described> = BTreeMap::new();
    for d in descriptions.0.into_inner().unwrap() {
        if d.help.trim().is_empty() {
            return Err(format!("{} is described with no text", d.name));
        }
        match by_name.get(&d.name) {
            Some(held) if *held != d => {
                return Err(format!(
                    "{} is described twice, differently: {held:?} and {d:?}",
                    d.name
                ));
            }
            _ => {
                by_name.insert(d.name.clone(), d);
            }
        }
    }
    Ok(by_name.into_values().collect())
}

/// A table of `metrics`: name, type as exposed, text.
pub fn render_table(metrics: &[Described]) -> String {
    let rows: Vec<Vec<String>> = metrics
        .iter()
        .map(|m| vec![code(&m.name), m.kind.exposed_as().into(), cell(&m.help)])
        .collect();
    table(&["metric", "type", "what it counts"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_are_kept_by_name_and_contradictions_refused() {
        let found = described(|| {
            metrics::describe_gauge!("b_up", "1 while up.");
            metrics::describe_counter!("a_total", "Things, by `kind`.");
            metrics::describe_counter!("a_total", "Things, by `kind`.");
            metrics::describe_histogram!("c_seconds", "Time.");
        })
        .unwrap();
        let names: Vec<(&str, Kind)> = found.iter().map(|d| (d.name.as_str(), d.kind)).collect();
        assert_eq!(
            names,
            [
                ("a_total", Kind::Counter),
                ("b_up", Kind::Gauge),
                ("c_seconds", Kind::Histogram)
            ]
        );
        assert!(
            render_table(&found).contains("| `c_seconds` | summary | Time. |"),
            "{}",
            render_table(&found)
        );
        let twice = described(|| {
            metrics::describe_counter!("a_total", "Things.");
            metrics::describe_gauge!("a_total", "Things.");
        });
        assert!(twice.unwrap_err().contains("twice"));
    }
}
