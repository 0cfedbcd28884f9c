//! Reloads: SIGUSR1s coalesced to IMEX's pace, held until the daemon answers, and the
//! catching-up and hold that follow one.

use super::*;

impl Inner {
    pub(super) fn signal_reload(&self, state: &mut State) {
        let Some(child) = state.child.as_ref().filter(|c| c.ended().is_none()) else {
            return;
        };
        let pid = child.pid.unwrap_or_default();
        if !state.answered {
            if !std::mem::replace(&mut state.reload_deferred, true) {
                metrics::counter!(IMEX_RELOADS_DEFERRED).increment(1);
                info!(
                    pid,
                    "IMEX reload waits for the daemon's first answer: signalled earlier, it could die of SIGUSR1"
                );
            }
            return;
        }
        child.signal(Signal::SIGUSR1);
        metrics::counter!(IMEX_RELOADS).increment(1);
        info!(pid, "IMEX daemon asked to reload (SIGUSR1)");
        let now = Instant::now();
        state.last_reload = Some(now);
        let slots = self.remote_slots(&state.peers);
        state
            .relinking
            .reloaded(slots, now, self.settings.relink_hold);
    }
}

/// At start with a keeper: nothing to catch up with unless it runs a daemon on our
/// config; one that no domain of this node adopts within twice the adoption hold (no
/// domain resumed IMEX) is not this node's to catch up with either.
pub(super) async fn settle_catching_up(inner: std::sync::Weak<Inner>) {
    let Some((keeper, config, hold)) = inner.upgrade().and_then(|i| {
        let keeper = i.keeper.clone()?;
        Some((keeper, i.settings.config_path(), i.settings.adoption_hold))
    }) else {
        return;
    };
    let running = keeper.instances().await.is_ok_and(|found| {
        found
            .iter()
            .any(|i| i.config == config && i.ended.is_none())
    });
    if running {
        tokio::time::sleep(hold * 2).await;
    }
    let Some(inner) = inner.upgrade() else { return };
    if !inner.state.lock().await.adopted {
        inner.catching_up.send_replace(false);
    }
}

/// Ends an adopted daemon's hold once it is over: from then on it serves the peers asked
/// for last, and those it kept that nobody asked for go. `generation`: the adoption's;
/// a daemon started since has no hold.
pub(super) async fn end_hold(inner: std::sync::Weak<Inner>, generation: u64) {
    let Some(hold) = inner.upgrade().map(|i| i.settings.adoption_hold) else {
        return;
    };
    tokio::time::sleep(hold).await;
    let Some(inner) = inner.upgrade() else { return };
    let mut state = inner.state.lock().await;
    if state.generation != generation || state.hold_until.take().is_none() {
        return;
    }
    inner.catching_up.send_replace(false);
    if !inner.alive(&mut state) {
        return;
    }
    let peers = state.peers.clone();
    match inner.settings.mode {
        AddressingMode::DnsNames => match inner.write_hosts(&peers, false) {
            Ok(true) => {
                info!("the adopted IMEX daemon's hold is over: serving the peers this node knows");
                request_reload(&inner, &mut state);
            }
            Ok(false) => {}
            Err(error) => {
                warn!(%error, "cannot write the peers after the adopted IMEX daemon's hold")
            }
        },
        AddressingMode::Ips => {
            let nodes_config = inner.nodes_config(&peers);
            if nodes_config == state.nodes_config {
                return;
            }
            let path = inner.settings.nodes_config_path();
            if let Err(error) = write_atomic(&path, &nodes_config) {
                warn!(%error, "cannot write {} after the adopted IMEX daemon's hold", path.display());
                return;
            }
            info!(
                "the adopted IMEX daemon's hold is over and its peers changed (IPs mode): restarting it"
            );
            inner.stop_child(&mut state).await;
            match inner.spawn(&mut state).await {
                Ok(()) => state.nodes_config = nodes_config,
                Err(error) => warn!(%error, "cannot restart the IMEX daemon after its hold"),
            }
        }
    }
}

/// Sends SIGUSR1 now, or when `reload_min_interval` has passed since the last one;
/// requests in between become one.
pub(super) fn request_reload(inner: &Arc<Inner>, state: &mut State) {
    let due = state
        .last_reload
        .map(|last| last + inner.settings.reload_min_interval)
        .filter(|due| *due > Instant::now());
    match due {
        None => inner.signal_reload(state),
        Some(_) if state.reload_pending => {}
        Some(due) => {
            state.reload_pending = true;
            let later = inner.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(due).await;
                let mut state = later.state.lock().await;
                state.reload_pending = false;
                later.signal_reload(&mut state);
            });
        }
    }
}
