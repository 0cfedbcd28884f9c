//! What the harness sees of a rack from outside, as an operator would: each node's
//! IMEX files (the hosts block that is its domain's peer set, and the nodes config),
//! its checkpoint, its IMEX daemon's process, its `/state`, and the status file.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use domaind_imex::hosts;
use domaind_kube_api::crd::ComputeDomainStatus;
use domaind_node::run::{NodeView, RunInfo};

/// A file as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead<T> {
    Missing,
    Read(T),
    /// It exists but is not what it should be: the reason.
    Bad(String),
}

impl<T> FileRead<T> {
    pub fn read(&self) -> Option<&T> {
        match self {
            FileRead::Read(value) => Some(value),
            _ => None,
        }
    }
}

/// The block of a hosts file that domaind manages: the domain's IMEX peer set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostsBlock {
    /// Slot → address, for slots somebody holds.
    pub slots: BTreeMap<u16, IpAddr>,
    /// Slots parked on the unused-slot address.
    pub parked: usize,
}

/// One node, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeObservation {
    pub hosts: FileRead<HostsBlock>,
    /// The nodes config: in DNS-names mode, one slot name per line and nothing else.
    pub nodes_config: FileRead<usize>,
    /// The claim uids in the checkpoint.
    pub checkpoint: FileRead<BTreeSet<String>>,
    /// Its IMEX daemon's pids (normally one; none while it is down).
    pub imex_pids: Vec<u32>,
    /// `/state`, for nodes that run and are not paused.
    pub view: Option<NodeView>,
    /// Why `/state` could not be read, when it was asked.
    pub view_error: Option<String>,
    /// `domaind_gossip_tls_reloads_total`, rotated and refused, when asked for.
    pub tls_reloads: Option<(u64, u64)>,
}

impl NodeObservation {
    pub fn empty() -> Self {
        Self {
            hosts: FileRead::Missing,
            nodes_config: FileRead::Missing,
            checkpoint: FileRead::Missing,
            imex_pids: Vec::new(),
            view: None,
            view_error: None,
            tls_reloads: None,
        }
    }

    pub fn imex_running(&self) -> bool {
        !self.imex_pids.is_empty()
    }
}

/// The rack, at one moment.
#[derive(Debug, Clone)]
pub struct Observation {
    pub at: Instant,
    pub nodes: Vec<NodeObservation>,
    pub status: FileRead<ComputeDomainStatus>,
}

/// Reads our block of a hosts file.
pub fn read_hosts(path: &Path) -> FileRead<HostsBlock> {
    match std::fs::read_to_string(path) {
        Ok(text) => match parse_hosts_block(&text) {
            Ok(block) => FileRead::Read(block),
            Err(reason) => FileRead::Bad(format!("{}: {reason}", path.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileRead::Missing,
        Err(e) => FileRead::Bad(format!("cannot read {}: {e}", path.display())),
    }
}

/// The slot → address mapping between domaind's markers. Anything in the block that
/// is not a slot name mapped to an address, or a parked slot, is an error: the block
/// is ours alone, and IMEX would resolve whatever is in it.
pub fn parse_hosts_block(text: &str) -> Result<HostsBlock, String> {
    let mut block = HostsBlock::default();
    let mut inside = false;
    let mut seen = false;
    for (number, line) in text.lines().enumerate() {
        match line.trim() {
            hosts::BEGIN if !inside => {
                if seen {
                    return Err(format!("a second domaind block at line {}", number + 1));
                }
                inside = true;
                seen = true;
                continue;
            }
            hosts::END if inside => {
                inside = false;
                continue;
            }
            _ if !inside => continue,
            "" => continue,
            _ => {}
        }
        let parked = line.contains(hosts::UNUSED);
        let content = line.split('#').next().unwrap_or("");
        let mut fields = content.split_whitespace();
        let ip: IpAddr = fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("line {} is not an address entry: {line:?}", number + 1))?;
        let names: Vec<&str> = fields.collect();
        if names.is_empty() {
            return Err(format!("line {} names nobody: {line:?}", number + 1));
        }
        for name in names {
            let slot = slot_of(name).ok_or_else(|| {
                format!(
                    "line {} maps {name:?}, which is not a slot name",
                    number + 1
                )
            })?;
            if parked {
                block.parked += 1;
            } else if block.slots.insert(slot, ip).is_some() {
                return Err(format!("slot {slot} is mapped twice"));
            }
        }
    }
    if inside {
        return Err("the domaind block is not closed (a torn write?)".into());
    }
    Ok(block)
}

/// `domaind-imex-slot-007` → 7.
fn slot_of(name: &str) -> Option<u16> {
    let digits = name.strip_prefix("domaind-imex-slot-")?;
    if digits.len() != 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The nodes config in DNS-names mode: how many slot names it lists. An address in it
/// would bypass the hosts mapping (a peer domaind cannot take away), so it is an error.
pub fn read_nodes_config(path: &Path) -> FileRead<usize> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileRead::Missing,
        Err(e) => return FileRead::Bad(format!("cannot read {}: {e}", path.display())),
    };
    let mut names = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if slot_of(line).is_none() {
            return FileRead::Bad(format!(
                "{} lists {line:?}, not a slot name",
                path.display()
            ));
        }
        names += 1;
    }
    FileRead::Read(names)
}

/// The claim uids of a checkpoint, read without the store's side effects. A write in
/// flight (a last line not yet whole) is not damage; a damaged record is.
pub fn read_checkpoint(state_dir: &Path) -> FileRead<BTreeSet<String>> {
    let replay = match domaind_checkpoint::inspect(state_dir) {
        Ok(Some(replay)) => replay,
        Ok(None) => return FileRead::Missing,
        Err(e) => {
            return FileRead::Bad(format!(
                "cannot read the checkpoint in {}: {e}",
                state_dir.display()
            ));
        }
    };
    if let Some(format) = replay.newer {
        return FileRead::Bad(format!(
            "the checkpoint in {} has format {format}, newer than this harness reads",
            state_dir.display()
        ));
    }
    if let Some(damaged) = replay.damaged.first() {
        return FileRead::Bad(format!(
            "the checkpoint in {} has {} damaged record(s), the first at line {}: {}",
            state_dir.display(),
            replay.damaged.len(),
            damaged.line,
            damaged.damage
        ));
    }
    FileRead::Read(replay.checkpoint.claims.keys().cloned().collect())
}

/// Certificate reloads in a Prometheus text exposition: `(rotated, refused)`.
pub fn tls_reloads(metrics: &str) -> (u64, u64) {
    let count = |result: &str| -> u64 {
        let label = format!("result=\"{result}\"");
        metrics
            .lines()
            .filter(|line| {
                line.starts_with(domaind_gossip::metrics::TLS_RELOADS) && line.contains(&label)
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|value| value as u64)
            .sum()
    };
    (count("rotated"), count("refused"))
}

/// How long one HTTP probe may take: a node that does not answer in this time is
/// reported, not waited for.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A node's `/state`, from the listener its `run.json` names.
pub async fn view(info: &RunInfo) -> Result<NodeView, String> {
    match tokio::time::timeout(PROBE_TIMEOUT, domaind_testbed::rack::node_view(info)).await {
        Ok(Ok(view)) => Ok(view),
        Ok(Err(error)) => Err(format!("{error:#}")),
        Err(_) => Err(format!(
            "/state of {} took over {PROBE_TIMEOUT:?}",
            info.node
        )),
    }
}

/// A node's certificate reloads (rotated, refused), from `/metrics`.
pub async fn reloads(addr: SocketAddr) -> Result<(u64, u64), String> {
    metrics(addr).await.map(|body| tls_reloads(&body))
}

/// A node's `/metrics` exposition.
pub async fn metrics(addr: SocketAddr) -> Result<String, String> {
    match tokio::time::timeout(
        PROBE_TIMEOUT,
        domaind_testbed::rack::http_get(addr, "/metrics"),
    )
    .await
    {
        Ok(Ok((200, body))) => Ok(body),
        Ok(Ok((code, _))) => Err(format!("/metrics on {addr} answered {code}")),
        Ok(Err(error)) => Err(format!("{error:#}")),
        Err(_) => Err(format!("/metrics on {addr} took over {PROBE_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &str = "127.0.0.1 localhost\n\
        # BEGIN domaind IMEX slots\n\
        127.0.9.2\tdomaind-imex-slot-000\n\
        127.255.255.254\tdomaind-imex-slot-001 # domaind: unused slot\n\
        127.0.9.1\tdomaind-imex-slot-002\n\
        # END domaind IMEX slots\n";

    #[test]
    fn the_block_maps_held_slots_and_counts_parked_ones() {
        let block = parse_hosts_block(BLOCK).unwrap();
        assert_eq!(
            block.slots,
            BTreeMap::from([
                (0, "127.0.9.2".parse().unwrap()),
                (2, "127.0.9.1".parse().unwrap())
            ])
        );
        assert_eq!(block.parked, 1);
    }

    #[test]
    fn foreign_names_torn_blocks_and_double_slots_are_errors() {
        let foreign = BLOCK.replace("domaind-imex-slot-002", "evil-host");
        assert!(
            parse_hosts_block(&foreign)
                .unwrap_err()
                .contains("evil-host")
        );
        let torn = BLOCK.replace("# END domaind IMEX slots\n", "");
        assert!(parse_hosts_block(&torn).unwrap_err().contains("not closed"));
        let twice = BLOCK.replace("domaind-imex-slot-002", "domaind-imex-slot-000");
        assert!(parse_hosts_block(&twice).unwrap_err().contains("twice"));
    }

    #[test]
    fn reloads_are_read_from_the_exposition() {
        let text = "# TYPE domaind_gossip_tls_reloads_total counter\n\
            domaind_gossip_tls_reloads_total{result=\"rotated\"} 2\n\
            domaind_gossip_tls_reloads_total{result=\"refused\"} 5\n";
        assert_eq!(tls_reloads(text), (2, 5));
        assert_eq!(tls_reloads(""), (0, 0));
    }
}
