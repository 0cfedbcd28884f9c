//! The daemon's process: spawned (through the guard or a keeper), adopted after a
//! restart of ours, watched, and stopped.

use super::*;

impl Inner {
    /// Fails, naming the port and who holds it, when IMEX could not listen on `port`. A
    /// holder that is an IMEX daemon of ours no domaind owns is stopped first.
    pub(super) async fn ensure_listenable(&self, port: u16, what: &str) -> Result<(), PortError> {
        let s = &self.settings;
        let Err(mut error) = listen_check::probe(s.bind_ip, port) else {
            return Ok(());
        };
        let mut held_by = holders::holders(s.bind_ip, port);
        let config = s.config_path();
        let ours: Vec<i32> = held_by
            .iter()
            .map(|h| h.pid)
            .filter(|pid| leftover::is_ours(*pid, &config))
            .collect();
        if !ours.is_empty() {
            leftover::stop_pids(&ours, s.stop_timeout, "it holds the IMEX port").await;
            match listen_check::probe(s.bind_ip, port) {
                Ok(()) => return Ok(()),
                Err(again) => error = again,
            }
            held_by = holders::holders(s.bind_ip, port);
        }
        // Whoever holds the port may let go of it: the supervisor asks again.
        Err(PortError::transient(listen_check::refusal(
            s.bind_ip,
            port,
            what,
            &error,
            &holders::describe(&held_by),
        )))
    }

    /// The daemon's command: through the guard when there is one, so that it dies
    /// with this process ([`guard::daemon_command`]).
    pub(super) fn daemon_command(&self) -> Command {
        let s = &self.settings;
        let args: Vec<String> = s.daemon.args.clone();
        guard::daemon_command(
            s.guard.as_ref(),
            &s.daemon.program,
            &args,
            &s.config_path(),
            &s.daemon_env,
        )
    }

    /// What a daemon started now serves, for the keeper to record and a later adapter to
    /// compare: config.cfg as we write it. The peers (the nodes config and, in DNS-names
    /// mode, the hosts block) are not part of it: a restarted node knows few of them at
    /// first, and an adopted daemon keeps those it serves for a while
    /// ([`ImexSettings::adoption_hold`]).
    /// An adopted daemon under its hold serves peers beyond those asked for: the
    /// node's view of its domain is still filling in.
    pub(super) fn serves_beyond(&self, state: &State) -> bool {
        let s = &self.settings;
        match s.mode {
            AddressingMode::DnsNames => {
                let served = std::fs::read_to_string(&s.hosts_file).unwrap_or_default();
                hosts::serves_beyond(&served, &state.peers, s.max_slots)
            }
            AddressingMode::Ips => state.nodes_config.lines().any(|line| {
                line.trim()
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| !state.peers.peers.values().any(|p| p.ip == ip))
            }),
        }
    }

    pub(super) fn served(&self) -> String {
        render_config(&self.settings)
    }

    pub(super) async fn spawn(&self, state: &mut State) -> Result<(), PortError> {
        let s = &self.settings;
        self.ensure_listenable(s.server_port, "SERVER_PORT").await?;
        self.ensure_listenable(s.cmd_port, "IMEX_CMD_PORT").await?;
        if let Some(keeper) = &self.keeper {
            let request = StartRequest {
                config: s.config_path(),
                program: s.daemon.program.clone(),
                args: s.daemon.args.clone(),
                env: s.daemon_env.clone(),
                served: self.served(),
            };
            let instance = keeper.start(&request).await.map_err(|e| {
                port_error(
                    &format!(
                        "cannot start the IMEX daemon {} through {}",
                        s.daemon.program.display(),
                        keeper.describe()
                    ),
                    e,
                )
            })?;
            metrics::counter!(IMEX_STARTS).increment(1);
            info!(pid = instance.pid, instance = instance.instance, program = %instance.program.display(), keeper = %keeper.describe(), "IMEX daemon started outside this process");
            self.took(
                state,
                follow_keeper(keeper.clone(), &instance, self.exits.clone()),
                None,
            );
            state.relinking.started(self.remote_slots(&state.peers));
            return Ok(());
        }
        let mut child = self
            .spawner
            .spawn(self.daemon_command())
            .await
            .map_err(|e| {
                io_error(
                    &format!(
                        "cannot start the IMEX daemon {} (is the NVIDIA IMEX package installed? \
                         the binary path is configurable; imex-sim stands in for it without \
                         GPUs)",
                        s.daemon.program.display()
                    ),
                    e,
                )
            })?;
        let output = OutputTail::of(&mut child);
        metrics::counter!(IMEX_STARTS).increment(1);
        info!(pid = child.id(), program = %s.daemon.program.display(), guarded = s.guard.is_some(), "IMEX daemon started");
        self.took(state, watch_child(child, self.exits.clone()), Some(output));
        state.relinking.started(self.remote_slots(&state.peers));
        Ok(())
    }

    /// A daemon is ours from now on: started, or adopted from its keeper.
    pub(super) fn took(&self, state: &mut State, child: Running, output: Option<OutputTail>) {
        state.child = Some(child);
        state.output = output;
        state.answered = false;
        state.reload_deferred = false;
        state.generation += 1;
        state.exited = None;
        state.last_reload = None;
        state.hold_until = None;
        state.kept = None;
        state.adopted = false;
        state.relinking = Relinking::default();
    }

    /// The slots of `peers` other than this node: the links IMEX makes.
    pub(super) fn remote_slots(&self, peers: &PeerSet) -> Vec<Slot> {
        let me = self.settings.bind_ip;
        peers
            .peers
            .iter()
            .filter(|(_, p)| p.ip != me)
            .map(|(slot, _)| *slot)
            .collect()
    }

    /// At start with a keeper: adopts its instance on our config when that serves
    /// `served`, keeps it while claims use it when it serves something else (or nothing
    /// recorded), stops it otherwise. Whether one was adopted or kept.
    pub(super) async fn adopt(&self, state: &mut State) -> Result<bool, PortError> {
        let Some(keeper) = &self.keeper else {
            return Ok(false);
        };
        let config = self.settings.config_path();
        let instances = keeper
            .instances()
            .await
            .map_err(|e| port_error(&format!("cannot ask {} what runs", keeper.describe()), e))?;
        let Some(found) = instances
            .into_iter()
            .find(|i| i.config == config && i.ended.is_none())
        else {
            return Ok(false);
        };
        let in_use = self
            .claims_in_use
            .load(std::sync::atomic::Ordering::Relaxed);
        if found.served != self.served() && in_use {
            let reason = if found.served.is_empty() {
                // The host's unit, started by someone else (at boot, by hand, by
                // systemd's own restart): what it serves is unknown.
                format!(
                    "instance {} (pid {:?}) of {} was not started by domaind: what config it serves is unknown",
                    found.instance,
                    found.pid,
                    keeper.describe()
                )
            } else {
                format!(
                    "instance {} (pid {:?}) was started with another config.cfg than this release writes",
                    found.instance, found.pid
                )
            };
            metrics::counter!(IMEX_ADOPTIONS, "outcome" => "kept").increment(1);
            warn!(
                pid = found.pid,
                instance = found.instance,
                keeper = %keeper.describe(),
                %reason,
                "the running IMEX daemon does not serve this node's config, but prepared claims use it: kept, not replaced"
            );
            self.took(
                state,
                follow_keeper(keeper.clone(), &found, self.exits.clone()),
                None,
            );
            state.kept = Some(reason);
            state.adopted = true;
            state.hold_until = Some(Instant::now() + self.settings.adoption_hold);
            // Caught up once a status query finds the node asks for all it serves.
            self.catching_up.send_replace(true);
            state.nodes_config =
                std::fs::read_to_string(self.settings.nodes_config_path()).unwrap_or_default();
            return Ok(true);
        }
        if found.served == self.served() {
            metrics::counter!(IMEX_ADOPTIONS, "outcome" => "adopted").increment(1);
            info!(
                pid = found.pid,
                instance = found.instance,
                keeper = %keeper.describe(),
                "IMEX daemon adopted: it serves the config this node has"
            );
            self.took(
                state,
                follow_keeper(keeper.clone(), &found, self.exits.clone()),
                None,
            );
            state.hold_until = Some(Instant::now() + self.settings.adoption_hold);
            // Caught up once a status query finds the node asks for all it serves.
            self.catching_up.send_replace(true);
            state.adopted = true;
            // What it was started with, not what this node knows of its peers yet.
            state.nodes_config =
                std::fs::read_to_string(self.settings.nodes_config_path()).unwrap_or_default();
            return Ok(true);
        }
        metrics::counter!(IMEX_ADOPTIONS, "outcome" => "replaced").increment(1);
        warn!(
            pid = found.pid,
            instance = found.instance,
            keeper = %keeper.describe(),
            "the running IMEX daemon does not serve this node's config (or nothing says what it serves): replacing it"
        );
        keeper
            .stop(&config, found.instance, self.settings.stop_timeout)
            .await
            .map_err(|e| {
                port_error(
                    &format!("cannot stop the IMEX daemon of {}", keeper.describe()),
                    e,
                )
            })?;
        Ok(false)
    }

    /// Whether the child still runs; if it ended, keeps how for the next status.
    pub(super) fn alive(&self, state: &mut State) -> bool {
        let Some(child) = state.child.as_ref() else {
            return false;
        };
        let Some(status) = child.ended() else {
            return true;
        };
        metrics::counter!(IMEX_EXITS).increment(1);
        warn!(%status, "IMEX daemon exited");
        state.child = None;
        state.exited = Some(Exit {
            status,
            output: state.output.take(),
        });
        false
    }

    /// An exit that no status has reported yet.
    pub(super) fn unreported_exit(state: &State) -> bool {
        state.exited.is_some() || state.child.as_ref().is_some_and(|c| c.ended().is_some())
    }

    pub(super) async fn stop_child(&self, state: &mut State) {
        state.output = None;
        let Some(mut child) = state.child.take() else {
            return;
        };
        child.signal(Signal::SIGTERM);
        match child.wait(self.settings.stop_timeout).await {
            Some(status) => info!(%status, "IMEX daemon stopped"),
            None => {
                warn!(timeout = ?self.settings.stop_timeout, "IMEX daemon ignored SIGTERM; killing it");
                let _ = child.asks.send(Ask::Kill);
                // SIGKILL cannot be ignored; the bound only guards against a task gone.
                child.wait(self.settings.stop_timeout).await;
            }
        }
    }
}

/// The handle of a daemon a keeper keeps: a task waits on the keeper for its end and
/// carries asks over as signals. Dropping the handle leaves the daemon running: it
/// outlives us by design.
pub(super) fn follow_keeper(
    keeper: Arc<dyn ImexKeeper>,
    instance: &Instance,
    exits: Arc<Notify>,
) -> Running {
    let (running, ended_tx, mut asks) = Running::owned_elsewhere(instance.pid);
    let (config, id) = (instance.config.clone(), instance.instance);
    tokio::spawn(async move {
        let ended = loop {
            tokio::select! {
                seen = keeper.wait(&config, id, RUNNER_WAIT) => match seen {
                    Ok(seen) => if let Some(ended) = seen.ended {
                        break if seen.last_output.is_empty() {
                            ended
                        } else {
                            format!("{ended}; last output: {}", seen.last_output.join(" | "))
                        };
                    },
                    // A runner's daemons die with it: one that is gone, or that no
                    // longer knows the instance, has none of ours; a unit whose main
                    // process is another has none either.
                    Err(error) if error.is_gone() => {
                        break format!("gone with its keeper: {error}");
                    }
                    Err(error) => {
                        warn!(%error, keeper = %keeper.describe(), retry_in = ?RUNNER_RETRY, "cannot follow the IMEX daemon through its keeper");
                        tokio::time::sleep(RUNNER_RETRY).await;
                    }
                },
                ask = asks.recv() => {
                    let signal = match ask {
                        Some(Ask::Signal(Signal::SIGUSR1)) => RunnerSignal::Usr1,
                        Some(Ask::Signal(Signal::SIGTERM)) => RunnerSignal::Term,
                        Some(Ask::Signal(other)) => {
                            warn!(signal = %other, "not a signal a keeper sends; ignored");
                            continue;
                        }
                        Some(Ask::Kill) => RunnerSignal::Kill,
                        None => return,
                    };
                    if let Err(error) = keeper.signal(&config, id, signal).await {
                        warn!(%error, ?signal, keeper = %keeper.describe(), "the IMEX daemon's keeper could not signal it");
                    }
                }
            }
        };
        let _ = ended_tx.send(Some(ended));
        exits.notify_waiters();
    });
    running
}
