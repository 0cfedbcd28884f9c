//! One way to call the API server: bounded in time, with failures sorted by what the
//! caller can do about them. kube's client has no read timeout by default, so a slow
//! API server would otherwise hold a prepare call, a status write or a slice publish
//! for as long as it likes.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A failed API call. The `kube::Error` stays as the source: callers sort by its
/// status code, and a chain printer shows what kube saw.
#[derive(Debug, Clone)]
pub enum ApiError {
    Timeout {
        what: String,
        limit: Duration,
    },
    Status {
        what: String,
        code: u16,
        reason: String,
        message: String,
        hint: &'static str,
        source: Arc<::kube::Error>,
    },
    Unreachable {
        what: String,
        source: Arc<::kube::Error>,
    },
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout { what, limit } => {
                write!(f, "{what}: the API server did not answer within {limit:?}")
            }
            Self::Status {
                what,
                code,
                reason,
                message,
                hint,
                ..
            } => write!(
                f,
                "{what}: the API server refused ({code} {reason}): {message}{hint}"
            ),
            Self::Unreachable { what, source } => {
                write!(f, "{what}: cannot reach the API server: {source}")
            }
        }
    }
}

// By hand, not derived: the source is the `kube::Error` itself (so a caller can
// downcast to it), not the `Arc` around it.
impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Timeout { .. } => None,
            Self::Status { source, .. } | Self::Unreachable { source, .. } => Some(source.as_ref()),
        }
    }
}

impl ApiError {
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// Someone else changed the object since it was read: read again, then retry.
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    /// May pass by itself, so worth retrying with backoff: no answer in time, no
    /// connection, an overloaded or failing server (408, 429, 5xx). Any other refusal
    /// (403, 404, 422, …) and a request or answer kube could not build or read get the
    /// same result when asked again: neither transient nor a conflict.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout { .. } => true,
            Self::Status { code, .. } => matches!(code, 408 | 429 | 500..=599),
            Self::Unreachable { source, .. } => !matches!(
                source.as_ref(),
                ::kube::Error::SerdeError(_)
                    | ::kube::Error::BuildRequest(_)
                    | ::kube::Error::FromUtf8(_)
            ),
        }
    }

    fn from_kube(what: &str, error: ::kube::Error) -> Self {
        match error {
            ::kube::Error::Api(status) => Self::Status {
                what: what.into(),
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                hint: hint(status.code, &status.message),
                source: Arc::new(::kube::Error::Api(status)),
            },
            other => Self::Unreachable {
                what: what.into(),
                source: Arc::new(other),
            },
        }
    }
}

/// What to do about a refusal. RBAC and the chart's admission policies both answer 403,
/// and the fixes differ: a permission to grant, or a token bound to the node.
fn hint(code: u16, message: &str) -> &'static str {
    match code {
        403 if message.contains("ValidatingAdmissionPolicy") => {
            " (an admission policy refused the write: the node daemon writes only its own \
             node's ResourceSlices and the status of domains that list it, with its pod's \
             token; see docs/src/install.md, \"Least privilege for the node daemon\")"
        }
        401 | 403 => {
            " (domaind's service account lacks a permission: see docs/src/install.md, \
             \"RBAC the node daemon needs\", for the RBAC it needs)"
        }
        _ => "",
    }
}

/// Runs `call` for at most `limit`. `what` names the call in errors ("get
/// ResourceClaim team-a/worker-0").
pub async fn bounded<T>(
    what: impl Into<String>,
    limit: Duration,
    call: impl Future<Output = Result<T, ::kube::Error>>,
) -> Result<T, ApiError> {
    let what = what.into();
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(ApiError::from_kube(&what, error)),
        Err(_) => Err(ApiError::Timeout { what, limit }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, message: &str) -> String {
        let status = ::kube::core::Status::failure(message, "Forbidden").with_code(code);
        ApiError::from_kube(
            "apply ResourceSlice s",
            ::kube::Error::Api(Box::new(status)),
        )
        .to_string()
    }

    #[test]
    fn a_refusal_says_whether_rbac_or_an_admission_policy_refused() {
        let rbac = refused(403, "User \"x\" cannot patch resource \"resourceslices\"");
        assert!(rbac.ends_with("for the RBAC it needs)"), "{rbac}");
        let policy = refused(
            403,
            "ValidatingAdmissionPolicy 'd-node-slices' with binding 'd-node-slices' denied \
             request: CREATE of ResourceSlice s refused",
        );
        assert!(
            policy
                .contains("denied request: CREATE of ResourceSlice s refused (an admission policy"),
            "{policy}"
        );
        assert!(
            policy.ends_with("\"Least privilege for the node daemon\")"),
            "{policy}"
        );
        assert!(refused(409, "conflict").ends_with(": conflict"));
    }

    fn refusal(code: u16) -> ApiError {
        let status = ::kube::core::Status::failure("refused", "Reason").with_code(code);
        ApiError::from_kube("patch x", ::kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn a_409_is_a_conflict_and_no_other_code_is() {
        assert!(refusal(409).is_conflict());
        assert!(!refusal(409).is_transient());
        for code in [403, 404, 422, 429, 500] {
            assert!(!refusal(code).is_conflict(), "{code}");
        }
    }

    #[test]
    fn overload_and_server_failures_are_transient_refusals_are_not() {
        for code in [408, 429, 500, 503, 504] {
            assert!(refusal(code).is_transient(), "{code}");
        }
        for code in [400, 401, 403, 404, 422] {
            assert!(!refusal(code).is_transient(), "{code}");
        }
    }

    #[test]
    fn no_connection_is_transient_an_unreadable_answer_is_not() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let unreachable = ApiError::from_kube("get x", ::kube::Error::Service(Box::new(reset)));
        assert!(unreachable.is_transient());
        assert!(
            unreachable
                .to_string()
                .starts_with("get x: cannot reach the API server: ")
        );
        let garbled = serde_json::from_str::<u8>("{").unwrap_err();
        let unreadable = ApiError::from_kube("get x", ::kube::Error::SerdeError(garbled));
        assert!(!unreadable.is_transient());
        assert!(!unreadable.is_conflict());
    }

    #[test]
    fn the_kube_error_stays_as_the_source() {
        use std::error::Error as _;
        let error = refusal(403);
        let source = error.source().expect("a source");
        match source.downcast_ref::<::kube::Error>() {
            Some(::kube::Error::Api(status)) => assert_eq!(status.code, 403),
            other => panic!("not the kube error: {other:?}"),
        }
        // A clone shares it.
        assert!(error.clone().source().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_hangs_times_out_with_its_name() {
        let never = std::future::pending::<Result<(), ::kube::Error>>();
        let error = bounded("get ResourceClaim a/b", Duration::from_secs(5), never)
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "get ResourceClaim a/b: the API server did not answer within 5s"
        );
        assert!(error.is_transient());
    }
}
