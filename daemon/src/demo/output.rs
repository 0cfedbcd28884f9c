//! What the demo prints about the rack: a line per rack and node, and how to poke it.

use super::*;

/// The line `--keep --json` prints first.
#[derive(Debug, Clone, Serialize)]
pub(super) struct RackLine {
    compute_domain: DemoDomain,
    /// Every clique's domain, the first being `compute_domain`; absent with one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    compute_domains: Vec<DemoDomain>,
    local_dir: PathBuf,
    nodes: Vec<NodeLine>,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct NodeLine {
    name: String,
    ip: String,
    gossip_addr: String,
    http_addr: String,
    /// Empty when the node serves no /state.
    state_addr: String,
    dra_socket: PathBuf,
    registration_socket: PathBuf,
}

pub(super) fn node_lines(rack: &LocalRack) -> Vec<NodeLine> {
    rack.nodes()
        .iter()
        .map(|n| NodeLine {
            name: n.name().to_owned(),
            ip: n.ip().to_string(),
            gossip_addr: n
                .info()
                .map(|i| i.gossip_addr.to_string())
                .unwrap_or_default(),
            http_addr: n
                .info()
                .map(|i| i.http_addr.to_string())
                .unwrap_or_default(),
            state_addr: n
                .info()
                .and_then(|i| i.state_addr)
                .map(|addr| addr.to_string())
                .unwrap_or_default(),
            dra_socket: n.dra_socket(),
            registration_socket: n.registration_socket(),
        })
        .collect()
}

pub(super) fn print_rack_line(rack: &LocalRack, domains: &[DemoDomain]) -> anyhow::Result<()> {
    let line = RackLine {
        compute_domain: domains[0].clone(),
        compute_domains: if domains.len() > 1 {
            domains.to_vec()
        } else {
            Vec::new()
        },
        local_dir: rack.local().root().to_owned(),
        nodes: node_lines(rack),
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", serde_json::to_string(&line)?)?;
    stdout.flush()?;
    Ok(())
}

pub(super) fn print_how_to_poke(rack: &LocalRack, domain: &DemoDomain, json: bool) {
    if json {
        return;
    }
    let local = rack.local();
    let first = &node_lines(rack)[0];
    println!(
        "\nThe rack keeps running. Poke it:\n\
         \x20 cat {status}\n\
         \x20 curl -s http://{state}/state\n\
         \x20 domaind kubelet-sim prepare --socket {socket} --claim {claim}:{ns}:{name}\n\
         \x20 kill -KILL <pid of a node> (see {root}/node-*/state/run.json)\n\
         Claims are files in {claims}; logs are {root}/node-*/domaind.log.\n\
         Ctrl-C stops the rack and removes its files.",
        status = local
            .status_path(&domain.uid)
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        state = first.state_addr,
        socket = first.dra_socket.display(),
        claim = claim_uid(&first.name),
        ns = domain.namespace,
        name = format_args!("{}-{}", domain.name, first.name),
        root = rack.spec().root.display(),
        claims = local.claims_dir().display(),
    );
}
