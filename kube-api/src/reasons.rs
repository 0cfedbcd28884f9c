//! The reasons of the conditions and events users and tools match on, each declared
//! once with what it means ([`reasons!`]): the code writes them from here and the book's
//! reference lists them from here.

use kube::runtime::events::EventType;

use crate::crd::ConditionStatus;

/// Declares a closed set of reasons: an enum whose variants are the reasons as
/// Kubernetes shows them, each documented and paired with the status it goes with (the
/// condition's status, the event's type). It gets `ALL`, `as_str`, `status` and
/// `meaning` (its doc comment), so that a reason cannot be added without its meaning.
#[macro_export]
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $status_ty:ty {
            $( $(#[doc = $doc:literal])+ $variant:ident => $status:expr ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[doc = $doc])+ $variant, )+
        }

        impl $name {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// As Kubernetes shows it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant)),+
                }
            }

            /// The status (of a condition) or type (of an event) it goes with.
            pub fn status(self) -> $status_ty {
                match self {
                    $(Self::$variant => $status),+
                }
            }

            /// What it means: its doc comment, on one line.
            pub fn meaning(self) -> &'static str {
                match self {
                    $(Self::$variant => concat!($($doc),+).trim_start()),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

reasons! {
    /// The reasons of a ComputeDomain's `Ready` condition, which the node daemons write
    /// (its reporter node) with the domain's status.
    pub enum DomainReadyReason: ConditionStatus {
        /// Every member node is ready.
        AllNodesReady => ConditionStatus::True,
        /// No node is a member: no pod of the domain has been prepared yet, or all left.
        NoNodes => ConditionStatus::False,
        /// Some member nodes are not ready; the message says which and why.
        NodesNotReady => ConditionStatus::False,
    }
}

reasons! {
    /// The reasons of a ComputeDomain's `TemplateReady` condition, which the controller
    /// writes ([`crate::names::TEMPLATE_READY`]).
    pub enum TemplateReadyReason: ConditionStatus {
        /// The ResourceClaimTemplate the spec names exists and is the domain's.
        TemplateCreated => ConditionStatus::True,
        /// A ResourceClaimTemplate of that name exists and is not the domain's: it is left
        /// alone. Name another template in a new ComputeDomain, or delete that one.
        TemplateNameTaken => ConditionStatus::False,
        /// The API server refused the template (an invalid name, say); the spec cannot
        /// change, so create a new ComputeDomain.
        TemplateRejected => ConditionStatus::False,
    }
}

reasons! {
    /// The events the controller records on a ComputeDomain.
    pub enum ControllerEventReason: EventType {
        /// The `TemplateReady` condition turned False for this reason; the note is the
        /// condition's message.
        TemplateNameTaken => EventType::Warning,
        /// The `TemplateReady` condition turned False for this reason; the note is the
        /// condition's message.
        TemplateRejected => EventType::Warning,
        /// The domain is being deleted: its template is gone, and it is released once its
        /// allocated claims (listed) are gone too.
        WaitingForMembers => EventType::Normal,
    }
}

reasons! {
    /// The reasons of the conditions the controller puts on a node's
    /// CertificateSigningRequest for its gossip certificate (`tls.mode: csr`), paired with
    /// the condition's type. A denial's reason is also its Warning event's and the
    /// `reason` of `domaind_controller_csr_decisions_total`.
    pub enum CsrReason: &'static str {
        /// Every rule holds: the controller approves and signs.
        NodeCertificateApproved => "Approved",
        /// Not asked by the node daemons' ServiceAccount.
        NotNodeDaemon => "Denied",
        /// Asked with a token bound to no pod on a node (or to several).
        NotBoundToNode => "Denied",
        /// Usages other than digital signature, server auth and client auth.
        BadUsages => "Denied",
        /// Not a CSR, a bad signature, an extension we do not know, or a CA asked for.
        BadRequest => "Denied",
        /// Not an ECDSA P-256 key signed with SHA-256.
        BadKey => "Denied",
        /// Names other than exactly the requester's node.
        NameMismatch => "Denied",
        /// An IP address that is not one of the requester's Node's.
        IpMismatch => "Denied",
        /// Someone else approved a request our rules refuse: it gets `Failed`, never a
        /// certificate (the Warning event names the rule).
        RefusedAfterApproval => "Failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_its_variant_with_its_doc_as_meaning() {
        assert_eq!(DomainReadyReason::NodesNotReady.as_str(), "NodesNotReady");
        assert_eq!(
            DomainReadyReason::NodesNotReady.to_string(),
            "NodesNotReady"
        );
        assert_eq!(
            DomainReadyReason::AllNodesReady.status(),
            ConditionStatus::True
        );
        assert_eq!(
            TemplateReadyReason::TemplateRejected.meaning(),
            "The API server refused the template (an invalid name, say); the spec cannot \
             change, so create a new ComputeDomain."
        );
        assert_eq!(DomainReadyReason::ALL.len(), 3);
    }

    /// The controller records a Warning event with the reason of every `TemplateReady`
    /// condition that is False.
    #[test]
    fn every_false_template_condition_has_its_warning_event() {
        for reason in TemplateReadyReason::ALL {
            if reason.status() == ConditionStatus::False {
                let event = ControllerEventReason::ALL
                    .iter()
                    .find(|e| e.as_str() == reason.as_str());
                assert_eq!(
                    event.map(|e| e.status()),
                    Some(EventType::Warning),
                    "{reason}"
                );
            }
        }
    }
}
