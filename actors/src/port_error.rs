//! A port's failure, sorted by what the core can do about it. Adapters decide the
//! kind where they know the cause (an API server's answer, an I/O error); the core
//! only reads it, so it never parses a message to tell a conflict from a timeout.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// What asking again can do about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// May pass by itself: a timeout, an unreachable server, a cache not synced yet.
    /// Worth retrying with backoff.
    Transient,
    /// Someone else changed the object first: read it again, then retry.
    Conflict,
    /// Refused, or the input is wrong (permissions, validation, a missing file): asking
    /// again soon gets the same answer, so a retry waits long, for a person to act.
    Permanent,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Transient => "transient",
            Self::Conflict => "conflict",
            Self::Permanent => "permanent",
        })
    }
}

/// A port's failure: its kind, what failed, and the error that caused it.
///
/// Display is the context followed by the source's text, as the logs showed before
/// errors were typed: a log line prints `%error` alone, not the chain. The source is
/// shared, not boxed, so an error can be cloned to every waiter of a failed write.
#[derive(Debug, Clone)]
pub struct PortError {
    kind: ErrorKind,
    context: String,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl PortError {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Self {
        Self {
            kind,
            context: context.into(),
            source: None,
        }
    }

    pub fn transient(context: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, context)
    }

    pub fn conflict(context: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, context)
    }

    pub fn permanent(context: impl Into<String>) -> Self {
        Self::new(ErrorKind::Permanent, context)
    }

    /// A failure that `source` says all about: no context of its own.
    pub fn from_source(kind: ErrorKind, source: impl Error + Send + Sync + 'static) -> Self {
        Self::new(kind, "").with_source(source)
    }

    /// Keeps `source` as the cause, for `Error::source` and its text after the context.
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }

    pub fn is_conflict(&self) -> bool {
        self.kind == ErrorKind::Conflict
    }

    pub fn is_permanent(&self) -> bool {
        self.kind == ErrorKind::Permanent
    }
}

impl fmt::Display for PortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.source, self.context.is_empty()) {
            (Some(source), true) => write!(f, "{source}"),
            (Some(source), false) => write!(f, "{}: {source}", self.context),
            (None, _) => f.write_str(&self.context),
        }
    }
}

impl Error for PortError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn Error + 'static))
    }
}

/// Two failures are alike when they would be handled and logged alike; sources are
/// compared by their text, since most error types have no equality.
impl PartialEq for PortError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.to_string() == other.to_string()
    }
}

impl Eq for PortError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_the_context_then_the_source_as_before() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let error = PortError::permanent("status write failed").with_source(io);
        assert_eq!(error.to_string(), "status write failed: denied");
        assert_eq!(error.kind(), ErrorKind::Permanent);
        let alone = PortError::from_source(
            ErrorKind::Transient,
            std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
        );
        assert_eq!(alone.to_string(), "timed out");
        assert_eq!(
            PortError::transient("cache not synced").to_string(),
            "cache not synced"
        );
    }

    #[test]
    fn the_source_is_kept_and_survives_a_clone() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let error = PortError::transient("IMEX status").with_source(io);
        let cloned = error.clone();
        let source = cloned.source().expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the io::Error itself, not its text");
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
        assert!(PortError::conflict("x").source().is_none());
    }
}
