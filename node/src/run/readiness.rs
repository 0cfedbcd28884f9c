//! What holds the node daemon's `/readyz` down while it runs: a checkpoint not on disk,
//! and (with `--ready-needs-kubelet`) a plugin the kubelet has not registered. Neither
//! is liveness: a restart would lose what the daemon holds in memory, and would not
//! make a kubelet register it sooner.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use super::http::Readiness;
use crate::checkpoint::Persistence;
use crate::dra::RegistrationState;

/// The name `/readyz` gives the kubelet's hold.
pub(super) const KUBELET: &str = "kubelet";

/// Why `/readyz` waits on the kubelet, if it does: until the kubelet has registered the
/// plugin, it cannot call it, and a pod needing a claim on this node cannot start.
pub(super) fn registration_hold(state: &RegistrationState, socket: &Path) -> Option<String> {
    match state {
        RegistrationState::Registered => None,
        RegistrationState::Pending => Some(format!(
            "the kubelet has not registered the DRA plugin yet (it finds {} in its \
             plugins_registry directory; is --kubelet-registry-dir the kubelet's?)",
            socket.display()
        )),
        RegistrationState::Refused { error } => {
            Some(format!("the kubelet refused the DRA plugin: {error}"))
        }
    }
}

/// Holds `/readyz` down until the kubelet has registered the plugin, and again if it
/// refuses it later.
pub(super) async fn hold_until_registered(
    mut registration: watch::Receiver<RegistrationState>,
    readiness: Arc<Readiness>,
    socket: PathBuf,
) {
    loop {
        let hold = registration_hold(&registration.borrow_and_update(), &socket);
        readiness.hold(KUBELET, hold);
        if registration.changed().await.is_err() {
            return;
        }
    }
}

/// Why `/readyz` waits on the checkpoint, if it does.
fn persistence_hold(persistence: &Persistence) -> Option<String> {
    match persistence {
        Persistence::Persisted => None,
        Persistence::NotPersisted { error, .. } => Some(format!(
            "the state directory cannot be written ({error}); prepares are served from \
             memory and written once it can"
        )),
        Persistence::Refused { error } => Some(error.clone()),
    }
}

/// Holds `/readyz` down while the checkpoint is not on disk.
pub(super) async fn hold_while_not_persisted(
    mut persistence: watch::Receiver<Persistence>,
    readiness: Arc<Readiness>,
) {
    loop {
        let hold = persistence_hold(&persistence.borrow_and_update());
        readiness.hold("checkpoint", hold);
        if persistence.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCKET: &str = "/var/lib/kubelet/plugins_registry/compute-domain.nvidia.com-reg.sock";

    #[test]
    fn only_a_registered_plugin_is_ready() {
        let socket = Path::new(SOCKET);
        assert_eq!(
            registration_hold(&RegistrationState::Registered, socket),
            None
        );
        let pending = registration_hold(&RegistrationState::Pending, socket).unwrap();
        assert!(
            pending.contains("not registered") && pending.contains(SOCKET),
            "{pending}"
        );
        let refused = registration_hold(
            &RegistrationState::Refused {
                error: "no supported DRA version".into(),
            },
            socket,
        )
        .unwrap();
        assert!(
            refused.contains("refused") && refused.contains("no supported DRA version"),
            "{refused}"
        );
    }
}
