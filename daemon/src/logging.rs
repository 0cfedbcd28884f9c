//! Structured logs with tracing: text for people, JSON for log pipelines.

use tracing_subscriber::EnvFilter;

use crate::cli::{LogFormat, LoggingArgs};

pub fn init(args: &LoggingArgs) {
    let filter = EnvFilter::try_new(&args.log).unwrap_or_else(|error| {
        eprintln!(
            "domaind: invalid --log filter {:?} ({error}); using \"info\"",
            args.log
        );
        EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
