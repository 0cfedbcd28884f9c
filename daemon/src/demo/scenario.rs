//! One clique's run of the demo: form, lose a daemon, lose the node, heal, take it
//! back; each step timed from the rack's own observations.

use super::*;

/// The domain of each clique is formed, loses its clique's last node to SIGKILL, heals
/// and takes the node back; with several cliques all at once, timed per clique.
pub(super) async fn scenario(
    rack: &mut LocalRack,
    domains: &[DemoDomain],
    args: &DemoArgs,
) -> anyhow::Result<FleetSummary> {
    let total = rack.nodes().len();
    let cliques: Vec<Vec<usize>> = (0..domains.len()).map(|c| rack.clique_members(c)).collect();
    let fleet = cliques.len() > 1;
    let size = |c: usize| cliques[c].len();
    let live = !args.json && std::io::stdout().is_terminal();
    let clique_of = (0..total).map(|i| rack.clique_of(i)).collect();
    let mut observer = Observer::new(live, args.json, domains.to_vec(), clique_of);
    let layout = if fleet {
        format!(
            "in {} NVLink cliques of {} (each node seeds gossip with its clique-mates only)",
            cliques.len(),
            args.nodes
        )
    } else {
        "in one NVLink clique".to_owned()
    };
    observer.say(&format!(
        "Starting a rack of {total} domaind nodes on 127.0.{}.1-{total}: TLS gossip, imex-sim linked over mTLS, \
         fake GB200 GPUs {layout}, the local backend in {}",
        args.subnet,
        rack.local().root().display()
    ));
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        rack.start_all()?;
        rack.wait_all_ready(STEP_LIMIT)?;
        Ok(())
    })?;
    if args.keep && args.json {
        print_rack_line(rack, domains)?;
    }

    for (i, node) in rack.nodes().iter().enumerate() {
        let clique = rack.clique_of(i);
        rack.local()
            .write_claim(&claim_file(node.name(), &domains[clique], size(clique)))?;
    }
    let which = if fleet {
        format!(
            "ComputeDomains {}/{}..{} (one per clique)",
            domains[0].namespace,
            domains[0].name,
            domains.len()
        )
    } else {
        format!("ComputeDomain {}/{}", domains[0].namespace, domains[0].name)
    };
    observer.say(&format!(
        "Preparing one claim per node for {which}, as each node's kubelet would"
    ));
    let started = Instant::now();
    let formed_cpu = busy::CpuMark::now();
    let prepares = futures::future::join_all(rack.nodes().iter().enumerate().map(|(i, node)| {
        let domain = &domains[rack.clique_of(i)];
        let (socket, claim) = (node.dra_socket(), claim_ref(node.name(), domain));
        async move { prepare_until_ready(&socket, &claim, DraVersion::V1, STEP_LIMIT).await }
    }));
    let (answers, formed_at, _) = observer
        .watch_each(rack, prepares, cliques.len(), |snapshot, c| {
            snapshot.ready(c, &cliques[c])
        })
        .await?;
    for (node, answer) in rack.nodes().iter().zip(answers) {
        if let Err(error) = answer? {
            bail!("{} refused its claim: {error}", node.name());
        }
    }
    let formed_ms = since(started, &formed_at);
    let formed_busy = formed_cpu
        .as_ref()
        .and_then(busy::CpuMark::busy_percent_since);
    let formed_work = formed_cpu.and_then(|mark| mark.work_since(&daemon_pids(rack)));
    for (c, ms) in formed_ms.iter().enumerate() {
        observer.say(&format!(
            "{}Domain formed: Ready {n}/{n} in {ms} ms",
            prefix(fleet, c),
            n = size(c)
        ));
    }

    let victims: Vec<usize> = cliques
        .iter()
        .map(|members| *members.last().expect("a clique has a node"))
        .collect();
    let killed: Vec<String> = victims
        .iter()
        .map(|v| rack.node(*v).name().to_owned())
        .collect();

    // The jobs: on every node, an import of memory from every peer.
    let mut imports = Vec::new();
    for node in 0..total {
        imports.push(rack.import(node).await?);
    }
    let daemon_kills =
        daemon_kill(rack, &mut observer, domains, &cliques, &victims, &imports).await?;
    for (c, kill) in daemon_kills.iter().enumerate() {
        observer.say(&format!(
            "{}{}'s daemon killed (IMEX keeps running): {} {n}/{n} throughout, {} of {} \
             imports broken, {} IMEX, daemon back in {} ms",
            prefix(fleet, c),
            killed[c],
            if kill.ready_throughout {
                "Ready"
            } else {
                "NOT Ready"
            },
            kill.imports_broken,
            kill.imports,
            if kill.same_imex { "the same" } else { "a NEW" },
            kill.back_ms,
            n = size(c)
        ));
    }

    observer.say(&format!(
        "Killing {} (daemon and IMEX) with SIGKILL: the node itself dies",
        killed.join(", ")
    ));
    let started = Instant::now();
    let heal_cpu = busy::CpuMark::now();
    tokio::task::block_in_place(|| victims.iter().try_for_each(|v| rack.kill_node(*v)))?;
    let (_, healed_at, _) = observer
        .watch_each(
            rack,
            std::future::ready(()),
            cliques.len(),
            |snapshot, c| snapshot.survivors_dropped(&cliques[c], &killed[c]),
        )
        .await?;
    let heal_ms = since(started, &healed_at);
    let heal_busy = heal_cpu
        .as_ref()
        .and_then(busy::CpuMark::busy_percent_since);
    let heal_work = heal_cpu.and_then(|mark| mark.work_since(&daemon_pids(rack)));
    for c in 0..cliques.len() {
        observer.say(&format!(
            "{}Survivors dropped {} from their IMEX peers in {} ms",
            prefix(fleet, c),
            killed[c],
            heal_ms[c]
        ));
    }

    let (_, listed_at, _) = observer
        .watch_each(
            rack,
            std::future::ready(()),
            cliques.len(),
            |snapshot, c| snapshot.status_lists_lost(c, &killed[c]),
        )
        .await?;
    let status_ms = since(started, &listed_at);
    // Every import of the victims' cliques breaks: the victim's with its IMEX, the
    // survivors' once their IMEX no longer lists it. How long the last one takes is
    // how long a survivor's IMEX kept a dead node configured.
    let expected = imports
        .iter()
        .filter(|i| {
            victims
                .iter()
                .any(|v| rack.clique_of(*v) == rack.clique_of(i.node))
        })
        .count();
    let mut imports_broken_by_node_kill = rack.broken_imports(&imports).await.len();
    let deadline = Instant::now() + IMPORTS_BREAK_LIMIT;
    while imports_broken_by_node_kill < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        imports_broken_by_node_kill = rack.broken_imports(&imports).await.len();
    }
    let imports_broken_ms = started.elapsed().as_millis() as u64;
    for c in 0..cliques.len() {
        observer.say(&format!(
            "{}Status NotReady with {} lost after {} ms (one write for the whole loss)",
            prefix(fleet, c),
            killed[c],
            status_ms[c]
        ));
    }
    observer.say(&format!(
        "{imports_broken_by_node_kill} of {expected} imports broken by the node's death \
         (the last seen {imports_broken_ms} ms after it): a job spanning a dead node fails"
    ));

    observer.say(&format!(
        "Restarting {}: {} restores its checkpoint and rejoins",
        killed.join(", "),
        if fleet { "each" } else { "it" }
    ));
    let started = Instant::now();
    let rejoin_cpu = busy::CpuMark::now();
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        for victim in &victims {
            rack.start(*victim)?;
        }
        for victim in &victims {
            rack.wait_ready(*victim, STEP_LIMIT)?;
        }
        Ok(())
    })?;
    let (_, rejoined_at, _) = observer
        .watch_each(
            rack,
            std::future::ready(()),
            cliques.len(),
            |snapshot, c| snapshot.ready(c, &cliques[c]),
        )
        .await?;
    let rejoin_ms = since(started, &rejoined_at);
    let rejoin_busy = rejoin_cpu
        .as_ref()
        .and_then(busy::CpuMark::busy_percent_since);
    let rejoin_work = rejoin_cpu.and_then(|mark| mark.work_since(&daemon_pids(rack)));
    let work_ms = match (formed_work, heal_work, rejoin_work) {
        (Some(formed), Some(heal), Some(rejoin)) => Some(StepWork {
            formed,
            heal,
            rejoin,
        }),
        _ => None,
    };
    let busy_percent = match (formed_busy, heal_busy, rejoin_busy) {
        (Some(formed), Some(heal), Some(rejoin)) => Some(BusyPercent {
            formed,
            heal,
            rejoin,
        }),
        _ => None,
    };
    for c in 0..cliques.len() {
        observer.say(&format!(
            "{}{} rejoined: Ready {n}/{n} in {} ms",
            prefix(fleet, c),
            killed[c],
            rejoin_ms[c],
            n = size(c)
        ));
    }

    let idle = match args.idle {
        Some(window) => {
            observer.say(&format!(
                "Leaving the rack alone for {} s, then measuring {} s of idle",
                idle::SETTLE.as_secs(),
                window.as_secs_f64()
            ));
            tokio::time::sleep(idle::SETTLE).await;
            let cost = idle::measure(rack, window).await?;
            if !args.json {
                print!("{}", idle::render(&cost));
            }
            Some(cost)
        }
        None => None,
    };

    let mut summaries = Vec::new();
    for (c, domain) in domains.iter().enumerate() {
        summaries.push(Summary {
            nodes: size(c),
            compute_domain: domain.clone(),
            formed_ms: formed_ms[c],
            killed: killed[c].clone(),
            daemon_kill: daemon_kills[c].clone(),
            imports_broken_by_node_kill,
            imports_broken_ms,
            heal_ms: heal_ms[c],
            status_ms: status_ms[c],
            rejoin_ms: rejoin_ms[c],
            busy_percent,
            work_ms,
            events: rack.local().read_events(&domain.uid)?.len(),
            rack_dir: rack.spec().root.clone(),
            // The whole rack's, measured once: on the first clique's summary.
            idle: if c == 0 { idle.clone() } else { None },
            ok: true,
        });
    }
    let crossings: Vec<String> = observer.crossings().iter().cloned().collect();
    if fleet {
        observer.fleet_summary(&summaries);
    } else {
        observer.summary(&summaries[0]);
    }
    if !crossings.is_empty() {
        bail!("nodes had gossip members or IMEX peers of another clique: {crossings:?}");
    }
    Ok(FleetSummary {
        cliques: summaries,
        crossings,
        ok: true,
    })
}

/// How long the demo waits for the node kill to break every import of its clique.
pub(super) const IMPORTS_BREAK_LIMIT: Duration = Duration::from_secs(15);

/// Milliseconds from `started` to each of `at`.
pub(super) fn since(started: Instant, at: &[Instant]) -> Vec<u64> {
    at.iter()
        .map(|at| at.saturating_duration_since(started).as_millis() as u64)
        .collect()
}

/// "clique 2: " before a clique's line, with several cliques.
pub(super) fn prefix(fleet: bool, clique: usize) -> String {
    if fleet {
        format!("clique {}: ", clique + 1)
    } else {
        String::new()
    }
}
