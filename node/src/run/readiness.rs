//! What holds the node daemon's `/readyz` down while it runs: a checkpoint not on disk,
//! (with `--ready-needs-kubelet`) a plugin the kubelet has not registered, and an
//! adopted IMEX daemon whose node is still catching up with its domains. None is
//! liveness: a restart would lose what the daemon holds in memory, and would not make
//! a kubelet register it sooner.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use super::http::Readiness;
use domaind_checkpoint::Persistence;
use domaind_kubelet_plugin::RegistrationState;

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

/// Why `/readyz` waits on IMEX, if it does: a restarted daemon that adopted its IMEX
/// serves peers it has not heard from yet (`ImexDaemon::catching_up`). A rolling update
/// paced by `/readyz` then restarts the next node only once this one caught up.
pub(super) fn catch_up_hold(catching_up: &bool) -> Option<String> {
    catching_up.then(|| {
        "the adopted IMEX daemon serves peers this node has not heard from since its \
         restart: catching up with its domains (at most the adoption hold)"
            .to_owned()
    })
}

/// Why `/readyz` waits on the checkpoint, if it does.
pub(super) fn persistence_hold(persistence: &Persistence) -> Option<String> {
    match persistence {
        Persistence::Persisted => None,
        Persistence::NotPersisted { error, .. } => Some(format!(
            "the state directory cannot be written ({error}); prepares are served from \
             memory and written once it can"
        )),
        Persistence::Refused { error } => Some(error.clone()),
    }
}

/// Holds `/readyz` down under `by` for as long as `reason` finds one in what `source`
/// says, following every change until the sender goes.
pub(super) async fn hold_while<T>(
    mut source: watch::Receiver<T>,
    readiness: Arc<Readiness>,
    by: &'static str,
    reason: impl Fn(&T) -> Option<String>,
) {
    loop {
        let hold = reason(&source.borrow_and_update());
        readiness.hold(by, hold);
        if source.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCKET: &str = "/var/lib/kubelet/plugins_registry/compute-domain.nvidia.com-reg.sock";

    #[test]
    fn a_node_catching_up_with_its_domains_is_not_ready() {
        let held = catch_up_hold(&true).unwrap();
        assert!(held.contains("catching up"), "{held}");
        assert_eq!(catch_up_hold(&false), None);
    }

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
