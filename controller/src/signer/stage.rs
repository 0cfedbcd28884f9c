//! What a CSR already went through, from its status alone: a certificate is never
//! issued twice, a decision never taken twice.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Issued, denied or failed: nothing more to do.
    Done,
    /// Approved (by us before a restart, or by someone else) but not signed.
    Approved,
    /// Nobody decided yet.
    Undecided,
}

pub fn stage(csr: &CertificateSigningRequest) -> Stage {
    let Some(status) = &csr.status else {
        return Stage::Undecided;
    };
    if status.certificate.as_ref().is_some_and(|c| !c.0.is_empty()) {
        return Stage::Done;
    }
    let holds = |type_: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == type_ && c.status == "True")
    };
    if holds("Denied") || holds("Failed") {
        Stage::Done
    } else if holds("Approved") {
        Stage::Approved
    } else {
        Stage::Undecided
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };

    use super::*;

    fn with(conditions: &[(&str, &str)], certificate: Option<&[u8]>) -> CertificateSigningRequest {
        CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                certificate: certificate.map(|c| k8s_openapi::ByteString(c.to_vec())),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| CertificateSigningRequestCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_issued_certificate_is_never_issued_again() {
        assert_eq!(
            stage(&with(&[("Approved", "True")], Some(b"PEM"))),
            Stage::Done
        );
        assert_eq!(stage(&with(&[], Some(b"PEM"))), Stage::Done);
    }

    #[test]
    fn a_decision_is_never_taken_twice() {
        assert_eq!(stage(&with(&[("Denied", "True")], None)), Stage::Done);
        assert_eq!(
            stage(&with(&[("Approved", "True"), ("Failed", "True")], None)),
            Stage::Done
        );
        assert_eq!(stage(&with(&[("Approved", "True")], None)), Stage::Approved);
        assert_eq!(
            stage(&with(&[("Approved", "True")], Some(b""))),
            Stage::Approved
        );
    }

    #[test]
    fn a_new_request_is_undecided() {
        assert_eq!(
            stage(&CertificateSigningRequest::default()),
            Stage::Undecided
        );
        assert_eq!(stage(&with(&[], None)), Stage::Undecided);
        assert_eq!(
            stage(&with(&[("Approved", "False")], None)),
            Stage::Undecided
        );
    }
}
