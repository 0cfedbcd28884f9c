//! Structured logs with tracing: text for people, JSON for log pipelines.

use tracing_subscriber::EnvFilter;

use crate::cli::{LogFormat, LoggingArgs};

/// kube-client's tracing layer logs every failed API request at ERROR, without saying
/// what the request was for; while an API server is unreachable that is a line per
/// retry. domaind logs those failures itself, with what it was doing and when it
/// retries, and counts them (`domaind_kube_requests_total{code="error"}`).
const QUIET_KUBE_CLIENT: &str = "kube_client::client::builder=off";

/// The filter to run with: the user's, plus [`QUIET_KUBE_CLIENT`] unless the user's
/// filter says anything about kube_client itself.
pub fn effective_filter(user: &str) -> String {
    if user.contains("kube_client") {
        user.to_owned()
    } else if user.trim().is_empty() {
        QUIET_KUBE_CLIENT.to_owned()
    } else {
        format!("{user},{QUIET_KUBE_CLIENT}")
    }
}

pub fn init(args: &LoggingArgs) {
    let filter = EnvFilter::try_new(effective_filter(&args.log)).unwrap_or_else(|error| {
        eprintln!(
            "domaind: invalid --log filter {:?} ({error}); using \"info\"",
            args.log
        );
        EnvFilter::new(effective_filter("info"))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_clients_request_errors_are_off_unless_asked_for() {
        assert_eq!(
            effective_filter("info"),
            "info,kube_client::client::builder=off"
        );
        assert_eq!(
            effective_filter("warn,domaind_gossip=debug"),
            "warn,domaind_gossip=debug,kube_client::client::builder=off"
        );
        assert_eq!(effective_filter(""), "kube_client::client::builder=off");
        assert_eq!(
            effective_filter("info,kube_client=trace"),
            "info,kube_client=trace"
        );
        for filter in ["info", "debug,domaind=trace", ""] {
            EnvFilter::try_new(effective_filter(filter)).unwrap();
        }
    }
}
