//! One way to call the API server: bounded in time, with failures sorted by what the
//! caller can do about them. kube's client has no read timeout by default, so a slow
//! API server would otherwise hold a prepare call, a status write or a slice publish
//! for as long as it likes.

use std::future::Future;
use std::time::Duration;

/// A failed API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{what}: the API server did not answer within {limit:?}")]
    Timeout { what: String, limit: Duration },
    #[error("{what}: the API server refused ({code} {reason}): {message}{hint}")]
    Status {
        what: String,
        code: u16,
        reason: String,
        message: String,
        hint: &'static str,
    },
    #[error("{what}: cannot reach the API server: {detail}")]
    Unreachable { what: String, detail: String },
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

    fn from_kube(what: &str, error: ::kube::Error) -> Self {
        match error {
            ::kube::Error::Api(status) => Self::Status {
                what: what.into(),
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                hint: hint(status.code, &status.message),
            },
            other => Self::Unreachable {
                what: what.into(),
                detail: other.to_string(),
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
             token; see the README, \"Least privilege for the node daemon\")"
        }
        401 | 403 => {
            " (domaind's service account lacks a permission: see the README, \
             \"Kubernetes backend\", for the RBAC it needs)"
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
    }
}
