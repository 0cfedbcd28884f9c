//! Admission of calls, for a graceful shutdown: once closed, new calls are refused with
//! UNAVAILABLE (the kubelet retries them, against our successor), while calls already
//! admitted are counted so shutdown can wait for them.

use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug, Clone, Copy)]
struct GateState {
    open: bool,
    in_flight: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct CallGate {
    state: watch::Sender<GateState>,
}

/// One admitted call; dropping it (however the call ends) lets shutdown go on.
#[derive(Debug)]
pub(crate) struct CallGuard {
    state: watch::Sender<GateState>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.state.send_modify(|state| state.in_flight -= 1);
    }
}

fn shutting_down() -> tonic::Status {
    tonic::Status::unavailable(
        "shutting down: the plugin takes no new calls; retry against its successor",
    )
}

impl CallGate {
    pub(crate) fn new() -> Self {
        Self {
            state: watch::Sender::new(GateState {
                open: true,
                in_flight: 0,
            }),
        }
    }

    /// Admits a call, or refuses it once shutdown began. Checked and counted under one
    /// lock, so a call is either refused or waited for, never neither.
    pub(crate) fn enter(&self) -> Result<CallGuard, tonic::Status> {
        let mut admitted = false;
        self.state.send_if_modified(|state| {
            admitted = state.open;
            if admitted {
                state.in_flight += 1;
            }
            admitted
        });
        if admitted {
            Ok(CallGuard {
                state: self.state.clone(),
            })
        } else {
            Err(shutting_down())
        }
    }

    /// Refuses as [`enter`](Self::enter) does once shutdown began, but admits without
    /// counting: for the kubelet's long-lived streams, which end when shutdown begins
    /// ([`closed`](Self::closed)) rather than being waited for.
    pub(crate) fn check_open(&self) -> Result<(), tonic::Status> {
        if self.state.borrow().open {
            Ok(())
        } else {
            Err(shutting_down())
        }
    }

    /// Resolves once shutdown began.
    pub(crate) fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut state = self.state.subscribe();
        async move {
            // The sender lives in `self` and in every guard; were it gone, nothing could
            // be admitted any more either.
            let _ = state.wait_for(|state| !state.open).await;
        }
    }

    pub(crate) fn close(&self) {
        self.state.send_modify(|state| state.open = false);
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.state.borrow().in_flight
    }

    /// Waits until no admitted call is left, at most `timeout`. True when none is left.
    pub(crate) async fn drained(&self, timeout: Duration) -> bool {
        let mut state = self.state.subscribe();
        tokio::time::timeout(timeout, state.wait_for(|state| state.in_flight == 0))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn closed_gate_refuses_and_waits_for_admitted_calls() {
        let gate = CallGate::new();
        let first = gate.enter().unwrap();
        let second = gate.enter().unwrap();
        gate.close();
        let refused = gate.enter().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(refused.message().contains("shutting down"));
        assert_eq!(gate.in_flight(), 2);

        assert!(!gate.drained(Duration::from_secs(1)).await);
        drop(first);
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.drained(Duration::from_secs(60)).await }
        });
        drop(second);
        assert!(waiter.await.unwrap());
        assert_eq!(gate.in_flight(), 0);
    }

    #[tokio::test]
    async fn streams_are_refused_once_closed_and_told_when_it_closes() {
        let gate = CallGate::new();
        assert!(gate.check_open().is_ok());
        let closed = tokio::spawn(gate.closed());
        tokio::task::yield_now().await;
        assert!(!closed.is_finished());
        gate.close();
        closed.await.unwrap();
        assert_eq!(
            gate.check_open().unwrap_err().code(),
            tonic::Code::Unavailable
        );
        // Admitted without being counted: shutdown does not wait for a stream.
        assert_eq!(gate.in_flight(), 0);
        gate.closed().await;
    }

    #[tokio::test]
    async fn an_idle_gate_is_drained_at_once() {
        let gate = CallGate::new();
        drop(gate.enter().unwrap());
        gate.close();
        assert!(gate.drained(Duration::ZERO).await);
    }
}
