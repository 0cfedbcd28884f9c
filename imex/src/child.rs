//! A spawned IMEX daemon, owned by one task that waits on it: an exit is known the
//! moment it happens, and signals go through that task, so none can reach a reaped
//! child's reused pid. Used by the adapter for a daemon of its own and by the runner
//! ([`super::runner`]) for the daemons it keeps.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::timeout;

/// A spawned child, owned by its [`watch_child`] task.
#[derive(Debug)]
pub struct Running {
    pub pid: Option<u32>,
    /// How it ended, once it has (set by the task after reaping it).
    ended: watch::Receiver<Option<String>>,
    /// Requests to the task; dropping it kills the child, as `kill_on_drop` did when
    /// we held the child ourselves.
    pub asks: mpsc::UnboundedSender<Ask>,
}

#[derive(Debug, Clone, Copy)]
pub enum Ask {
    Signal(Signal),
    Kill,
}

impl Running {
    pub fn ended(&self) -> Option<String> {
        self.ended.borrow().clone()
    }

    /// Follows the end, apart from this handle.
    pub fn watch_end(&self) -> watch::Receiver<Option<String>> {
        self.ended.clone()
    }

    /// A handle whose child another task owns: it takes the handle's `asks` and
    /// publishes the end through the sender.
    pub fn owned_elsewhere(
        pid: Option<u32>,
    ) -> (
        Self,
        watch::Sender<Option<String>>,
        mpsc::UnboundedReceiver<Ask>,
    ) {
        let (ended_tx, ended) = watch::channel(None);
        let (asks, ask_rx) = mpsc::unbounded_channel();
        (Self { pid, ended, asks }, ended_tx, ask_rx)
    }

    pub fn signal(&self, signal: Signal) {
        let _ = self.asks.send(Ask::Signal(signal));
    }

    /// Waits up to `limit` for the child to end; whether it did.
    pub async fn wait(&mut self, limit: Duration) -> Option<String> {
        match timeout(limit, self.ended.wait_for(Option::is_some)).await {
            Ok(Ok(ended)) => ended.clone(),
            // The task is gone without a word: it was dropped with the runtime.
            Ok(Err(_)) => Some("gone with its watcher".into()),
            Err(_) => None,
        }
    }
}

/// Owns `child` until it ends: signals it when asked, kills it when asked or when the
/// [`Running`] handle is dropped, and reaps it, publishing how it ended and waking
/// `exits`. Only this task reaps the child, so a pid it signals is still the child's.
pub fn watch_child(mut child: Child, exits: Arc<Notify>) -> Running {
    let (running, ended_tx, mut ask_rx) = Running::owned_elsewhere(child.id());
    tokio::spawn(async move {
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                ask = ask_rx.recv() => match ask {
                    Some(Ask::Signal(signal)) => {
                        if let Some(pid) = child.id() {
                            let _ = kill(Pid::from_raw(pid as i32), signal);
                        }
                    }
                    Some(Ask::Kill) | None => {
                        let _ = child.start_kill();
                        break child.wait().await;
                    }
                },
            }
        };
        let ended = match status {
            Ok(status) => status.to_string(),
            Err(error) => format!("cannot be waited for: {error}"),
        };
        let _ = ended_tx.send(Some(ended));
        exits.notify_waiters();
    });
    running
}
