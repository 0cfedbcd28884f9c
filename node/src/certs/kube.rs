//! The signer through the Kubernetes CertificateSigningRequest API: create a CSR of our
//! signerName, then watch it until the controller issues or denies it. The API server
//! records who asked (`spec.username`, and from a pod-bound token the node, in
//! `spec.extra`): the node cannot choose what the signer checks.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::wait::await_condition;
use kube::{Api, Client, ResourceExt as _};

use super::port::{Answer, Signer};
use domaind_actors::ports::PortError;
use domaind_backends::kube::port_error;
use domaind_kube_api::bounded;
use domaind_kube_api::names::{GOSSIP_CERT_USAGES, GOSSIP_SIGNER};

/// The smallest `expirationSeconds` the API server accepts.
const MIN_EXPIRATION: Duration = Duration::from_secs(600);

#[derive(Clone)]
pub struct KubeSigner {
    api: Api<CertificateSigningRequest>,
    /// Each API call (`--kube-api-timeout`).
    api_timeout: Duration,
    /// How long to wait for the signer's answer before asking again.
    answer_timeout: Duration,
}

impl std::fmt::Debug for KubeSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSigner")
            .field("api_timeout", &self.api_timeout)
            .field("answer_timeout", &self.answer_timeout)
            .finish_non_exhaustive()
    }
}

impl KubeSigner {
    pub fn new(client: Client, api_timeout: Duration, answer_timeout: Duration) -> Self {
        Self {
            api: Api::all(client),
            api_timeout,
            answer_timeout,
        }
    }
}

/// The CSR the node submits.
pub fn csr_object(node: &str, csr_pem: &str, lifetime: Duration) -> CertificateSigningRequest {
    let seconds = lifetime.max(MIN_EXPIRATION).as_secs();
    CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("domaind-gossip-{node}-")),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: GOSSIP_SIGNER.into(),
            usages: Some(
                GOSSIP_CERT_USAGES
                    .iter()
                    .map(|u| (*u).to_string())
                    .collect(),
            ),
            expiration_seconds: Some(i32::try_from(seconds).unwrap_or(i32::MAX)),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    }
}

/// The signer's answer, once there is one.
pub fn answer_of(csr: &CertificateSigningRequest) -> Option<Answer> {
    let status = csr.status.as_ref()?;
    if let Some(cert) = status.certificate.as_ref().filter(|c| !c.0.is_empty()) {
        return Some(Answer::Issued(
            String::from_utf8_lossy(&cert.0).into_owned(),
        ));
    }
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        .map(|c| Answer::Denied {
            reason: c.reason.clone().unwrap_or_else(|| c.type_.clone()),
            message: c.message.clone().unwrap_or_default(),
        })
}

#[async_trait]
impl Signer for KubeSigner {
    async fn request(
        &self,
        node: &str,
        csr_pem: &str,
        lifetime: Duration,
    ) -> Result<Answer, PortError> {
        let created = bounded(
            "cannot create a CertificateSigningRequest",
            self.api_timeout,
            self.api
                .create(&PostParams::default(), &csr_object(node, csr_pem, lifetime)),
        )
        .await
        .map_err(port_error)?;
        let name = created.name_any();
        let answered = await_condition(
            self.api.clone(),
            &name,
            |csr: Option<&CertificateSigningRequest>| {
                csr.is_some_and(|csr| answer_of(csr).is_some())
            },
        );
        match tokio::time::timeout(self.answer_timeout, answered).await {
            Ok(Ok(Some(csr))) => answer_of(&csr)
                .ok_or_else(|| PortError::transient(format!("CSR {name} has no answer"))),
            Ok(Ok(None)) => Err(PortError::transient(format!(
                "CSR {name} was deleted before the signer answered"
            ))),
            Ok(Err(error)) => {
                Err(PortError::transient(format!("cannot watch CSR {name}")).with_source(error))
            }
            Err(_) => Err(PortError::transient(format!(
                "the signer ({GOSSIP_SIGNER}) did not answer CSR {name} within {:?}: is the controller running with --node-service-account?",
                self.answer_timeout
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };

    use super::*;

    #[test]
    fn the_request_names_our_signer_gossips_usages_and_at_least_ten_minutes() {
        let csr = csr_object("node-a", "PEM", Duration::from_secs(60));
        assert_eq!(csr.spec.signer_name, GOSSIP_SIGNER);
        assert_eq!(csr.spec.expiration_seconds, Some(600));
        assert_eq!(csr.spec.usages.unwrap(), GOSSIP_CERT_USAGES);
        assert_eq!(
            csr.metadata.generate_name.as_deref(),
            Some("domaind-gossip-node-a-")
        );
        let day = csr_object("node-a", "PEM", Duration::from_secs(86400));
        assert_eq!(day.spec.expiration_seconds, Some(86400));
    }

    #[test]
    fn the_answer_is_the_certificate_or_the_denial_and_pending_is_none() {
        let mut csr = csr_object("node-a", "PEM", Duration::from_secs(600));
        assert_eq!(answer_of(&csr), None);
        let condition = |type_: &str| CertificateSigningRequestCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: Some("NameMismatch".into()),
            message: Some("names node-b".into()),
            ..Default::default()
        };
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![condition("Approved")]),
            certificate: None,
        });
        assert_eq!(answer_of(&csr), None);
        for type_ in ["Denied", "Failed"] {
            csr.status.as_mut().unwrap().conditions = Some(vec![condition(type_)]);
            assert_eq!(
                answer_of(&csr),
                Some(Answer::Denied {
                    reason: "NameMismatch".into(),
                    message: "names node-b".into()
                })
            );
        }
        csr.status.as_mut().unwrap().certificate = Some(k8s_openapi::ByteString(b"CERT".to_vec()));
        assert_eq!(answer_of(&csr), Some(Answer::Issued("CERT".into())));
    }
}
