//! `domaind demo --domains N`: N ComputeDomains with `isolation: Channel` on the same
//! rack, every node holding a claim of each. They form at once, each on a channel of
//! its own; the demo reads the CDI spec every claim was given and checks that each
//! pod gets its own domain's channel device and no other; then it deletes the first
//! domain (its claims unprepared everywhere) and shows the others stay Ready on their
//! channels.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use domaind_actors::model::{AllocationMode, ClaimRef, Isolation, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_kube_api::crd::{self, ComputeDomainStatus};
use domaind_kube_api::names::DEFAULT_DRIVER_NAME;
use domaind_kubelet_plugin::DraVersion;
use domaind_kubelet_plugin::client::KubeletClient;
use domaind_prepare::cdi::{CdiWriter, ClaimUid, Spec, channel_device_path};
use domaind_testbed::rack::{LocalRack, node_view, prepare_until_ready};
use domaind_testkit::poll_until_every;
use serde::Serialize;

use super::{DemoArgs, DemoDomain, STEP_LIMIT, demo_uid};

/// How often the rack is looked at while waiting.
const LOOK: Duration = Duration::from_millis(100);

/// One claim, as its pod would get it.
#[derive(Debug, Clone, Serialize)]
pub struct PodChannel {
    pub node: String,
    pub claim: String,
    /// The channel of the device node in the claim's CDI spec.
    pub cdi_channel: u32,
    /// The device node's path in the container.
    pub device: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct SharedDomain {
    pub compute_domain: DemoDomain,
    /// The channel the status publishes.
    pub channel: u32,
    /// Prepare calls issued for every domain → every call answered and this domain's
    /// status Ready with every node.
    pub formed_ms: u64,
    pub pods: Vec<PodChannel>,
}

/// What `--json` prints at the end with `--domains` above 1.
#[derive(Debug, Clone, Serialize)]
pub struct SharingSummary {
    pub nodes: usize,
    pub domains: Vec<SharedDomain>,
    /// The domain whose claims were all unprepared.
    pub deleted: DemoDomain,
    /// First unprepare → no node shows the deleted domain any more (its claims' CDI
    /// specs are checked gone then).
    pub deleted_ms: u64,
    /// After the deletion: each remaining domain's status, and its channel.
    pub remaining: Vec<Remaining>,
    /// Where the rack's files were; removed when the demo ends.
    pub rack_dir: PathBuf,
    pub ok: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Remaining {
    pub name: String,
    pub status: String,
    pub ready_nodes: u32,
    pub channel: Option<u32>,
}

pub(super) async fn scenario(
    rack: &mut LocalRack,
    args: &DemoArgs,
) -> anyhow::Result<SharingSummary> {
    let say = |line: &str| {
        if !args.json {
            println!("==> {line}");
        }
    };
    let nodes = rack.nodes().len();
    let domains: Vec<DemoDomain> = (1..=usize::from(args.domains))
        .map(|n| DemoDomain {
            namespace: "default".into(),
            name: format!("demo-domain-{n}"),
            uid: demo_uid(),
        })
        .collect();
    say(&format!(
        "Starting a rack of {nodes} domaind nodes on 127.0.{}.1-{nodes}: TLS gossip, imex-sim, \
         fake GB200 GPUs in one NVLink clique, the local backend in {}",
        args.subnet,
        rack.local().root().display()
    ));
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        rack.start_all()?;
        rack.wait_all_ready(STEP_LIMIT)?;
        Ok(())
    })?;

    for node in rack.nodes() {
        for domain in &domains {
            rack.local()
                .write_claim(&claim_file(node.name(), domain, nodes))?;
        }
    }
    say(&format!(
        "Preparing one claim per node for each of {} ComputeDomains with isolation: Channel ({}), \
         all at once, as each node's kubelet would",
        domains.len(),
        names(&domains)
    ));
    let started = Instant::now();
    let calls = rack.nodes().iter().flat_map(|node| {
        domains.iter().map(move |domain| {
            let (socket, claim) = (node.dra_socket(), claim_ref(node.name(), domain));
            let who = format!("{} on {}", domain.name, node.name());
            async move {
                match prepare_until_ready(&socket, &claim, DraVersion::V1, STEP_LIMIT).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(error)) => bail!("{who} was refused: {error}"),
                    Err(error) => Err(error.context(who)),
                }
            }
        })
    });
    for answer in futures::future::join_all(calls).await {
        answer?;
    }
    let mut shared = Vec::new();
    for domain in &domains {
        let status = poll_until_every(LOOK, STEP_LIMIT, || ready_status(rack, domain, nodes))
            .await
            .with_context(|| {
                format!(
                    "{} did not become Ready {nodes}/{nodes} within {STEP_LIMIT:?}",
                    domain.name
                )
            })?;
        let channel = status
            .channel
            .with_context(|| format!("{}'s status publishes no channel", domain.name))?;
        let formed_ms = started.elapsed().as_millis() as u64;
        say(&format!(
            "{}: Ready {nodes}/{nodes} on channel {channel} in {formed_ms} ms",
            domain.name
        ));
        shared.push(SharedDomain {
            compute_domain: domain.clone(),
            channel,
            formed_ms,
            pods: pod_channels(rack, domain)?,
        });
    }
    let distinct: BTreeSet<u32> = shared.iter().map(|d| d.channel).collect();
    if distinct.len() != shared.len() {
        bail!("two domains were given one channel: {}", channels(&shared));
    }
    if !args.json {
        print!("{}", pods_table(rack, &shared));
    }
    for domain in &shared {
        if let Some(pod) = domain.pods.iter().find(|p| p.cdi_channel != domain.channel) {
            bail!(
                "{} of {} was given channel {} in its CDI spec, not its domain's {}",
                pod.claim,
                domain.compute_domain.name,
                pod.cdi_channel,
                domain.channel
            );
        }
    }
    say(&format!(
        "Each node's pods got only their own domain's channel device ({})",
        channels(&shared)
    ));

    let (first, rest) = shared.split_first().expect("--domains is 2 or more");
    let deleted = first.compute_domain.clone();
    say(&format!(
        "Deleting {}: its claim unprepared on every node, as the kubelet does when its pods go",
        deleted.name
    ));
    let started = Instant::now();
    for node in rack.nodes() {
        let client = KubeletClient::connect(node.dra_socket()).await?;
        let answers = client
            .unprepare(&[claim_ref(node.name(), &deleted)], DraVersion::V1)
            .await?;
        for answer in answers {
            answer
                .result
                .map_err(|error| anyhow::anyhow!("unprepare on {}: {error}", node.name()))?;
        }
        rack.local()
            .remove_claim(&claim_uid(node.name(), &deleted))?;
    }
    poll_until_every(LOOK, STEP_LIMIT, || async {
        (!shown_anywhere(rack, &deleted.uid).await).then_some(())
    })
    .await
    .with_context(|| {
        format!(
            "nodes still show {} {STEP_LIMIT:?} after its claims went",
            deleted.name
        )
    })?;
    let deleted_ms = started.elapsed().as_millis() as u64;
    let left = cdi_specs_left(rack, &deleted)?;
    if !left.is_empty() {
        bail!("{}'s CDI specs outlived its claims: {left:?}", deleted.name);
    }
    say(&format!(
        "{} is gone from every node (its CDI specs too) in {deleted_ms} ms: channel {} is free",
        deleted.name, first.channel
    ));
    let mut remaining = Vec::new();
    for domain in rest {
        let status = ready_status(rack, &domain.compute_domain, nodes)
            .await
            .with_context(|| {
                format!(
                    "{} is not Ready after the deletion",
                    domain.compute_domain.name
                )
            })?;
        if status.channel != Some(domain.channel) {
            bail!(
                "{} moved from channel {} to {:?}",
                domain.compute_domain.name,
                domain.channel,
                status.channel
            );
        }
        let pods = pod_channels(rack, &domain.compute_domain)?;
        if pods.iter().any(|p| p.cdi_channel != domain.channel) {
            bail!("{}'s pods lost their channel", domain.compute_domain.name);
        }
        say(&format!(
            "{} stays Ready {nodes}/{nodes} on channel {}",
            domain.compute_domain.name, domain.channel
        ));
        remaining.push(Remaining {
            name: domain.compute_domain.name.clone(),
            status: status.status.to_string(),
            ready_nodes: status.ready_nodes,
            channel: status.channel,
        });
    }
    if !args.json {
        println!(
            "\nSummary: {} ComputeDomains shared {nodes} nodes with isolation: Channel ({}); \
             every pod got its own domain's channel device only; {} was deleted in {deleted_ms} ms \
             and the rest stayed Ready.",
            shared.len(),
            channels(&shared),
            deleted.name
        );
    }
    Ok(SharingSummary {
        nodes,
        domains: shared,
        deleted,
        deleted_ms,
        remaining,
        rack_dir: rack.spec().root.clone(),
        ok: true,
    })
}

fn names(domains: &[DemoDomain]) -> String {
    domains
        .iter()
        .map(|d| format!("{}/{}", d.namespace, d.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn channels(domains: &[SharedDomain]) -> String {
    domains
        .iter()
        .map(|d| format!("{} channel {}", d.compute_domain.name, d.channel))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `domain`'s status, when it says Ready with all `nodes`.
async fn ready_status(
    rack: &LocalRack,
    domain: &DemoDomain,
    nodes: usize,
) -> Option<ComputeDomainStatus> {
    rack.local()
        .read_status(&domain.uid)
        .ok()
        .flatten()
        .filter(|s| s.status == crd::Phase::Ready && s.ready_nodes as usize == nodes)
}

/// Whether any node's `/state` still shows domain `uid`: as a domain of its own, or in
/// its shared IMEX domain's channels.
async fn shown_anywhere(rack: &LocalRack, uid: &str) -> bool {
    for node in rack.nodes() {
        let Some(info) = node.info() else {
            continue;
        };
        match node_view(info).await {
            Ok(view) => {
                let shared = view
                    .shared_imex
                    .as_ref()
                    .is_some_and(|s| s.channels.contains_key(uid));
                if shared || view.domains.iter().any(|d| d.uid == uid) {
                    return true;
                }
            }
            // Not readable now: not known to be gone.
            Err(_) => return true,
        }
    }
    false
}

/// The channel each node's claim of `domain` was given, from the CDI spec the DRA
/// plugin wrote for it: what the container runtime would put in the pod.
fn pod_channels(rack: &LocalRack, domain: &DemoDomain) -> anyhow::Result<Vec<PodChannel>> {
    let mut pods = Vec::new();
    for node in rack.nodes() {
        let writer = CdiWriter::new(node.cdi_dir(), DEFAULT_DRIVER_NAME)?;
        let claim = claim_uid(node.name(), domain);
        let path = writer.spec_path(&ClaimUid::new(&claim)?);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no CDI spec for {claim}: {}", path.display()))?;
        let spec: Spec = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a CDI spec", path.display()))?;
        let device_nodes: Vec<_> = spec
            .devices
            .iter()
            .flat_map(|d| &d.container_edits.device_nodes)
            .collect();
        let [device] = device_nodes.as_slice() else {
            bail!(
                "{} gives {claim} {} device nodes, not one channel",
                path.display(),
                device_nodes.len()
            );
        };
        if device.path != channel_device_path(device.minor) {
            bail!(
                "{}: device {} is not channel {}'s",
                path.display(),
                device.path,
                device.minor
            );
        }
        pods.push(PodChannel {
            node: node.name().to_owned(),
            claim,
            cdi_channel: device.minor,
            device: device.path.clone(),
        });
    }
    Ok(pods)
}

/// The CDI specs of `domain`'s claims still on the nodes' disks.
fn cdi_specs_left(rack: &LocalRack, domain: &DemoDomain) -> anyhow::Result<Vec<PathBuf>> {
    let mut left = Vec::new();
    for node in rack.nodes() {
        let writer = CdiWriter::new(node.cdi_dir(), DEFAULT_DRIVER_NAME)?;
        let path = writer.spec_path(&ClaimUid::new(&claim_uid(node.name(), domain))?);
        if path.exists() {
            left.push(path);
        }
    }
    Ok(left)
}

/// Node by node, the channel device each domain's pod got.
fn pods_table(rack: &LocalRack, domains: &[SharedDomain]) -> String {
    let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for domain in domains {
        for pod in &domain.pods {
            by_node.entry(&pod.node).or_default().push(&pod.device);
        }
    }
    let mut header = format!("{:<9}", "NODE");
    for domain in domains {
        header.push_str(&format!(
            " {:<40}",
            format!(
                "{} (channel {})",
                domain.compute_domain.name, domain.channel
            )
        ));
    }
    let mut lines = vec![header];
    for node in rack.nodes() {
        let mut line = format!("{:<9}", node.name());
        for device in by_node.get(node.name()).into_iter().flatten() {
            line.push_str(&format!(" {device:<40}"));
        }
        lines.push(line);
    }
    let lines: Vec<&str> = lines.iter().map(|l| l.trim_end()).collect();
    format!("\n{}\n\n", lines.join("\n"))
}

fn claim_file(node: &str, domain: &DemoDomain, nodes: usize) -> ClaimFile {
    ClaimFile {
        namespace: domain.namespace.clone(),
        name: format!("{}-{node}", domain.name),
        uid: claim_uid(node, domain),
        compute_domain: ComputeDomainRef {
            namespace: domain.namespace.clone(),
            name: domain.name.clone(),
            uid: domain.uid.clone(),
            num_nodes: nodes as u32,
            isolation: Isolation::Channel,
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
        admin_access: false,
    }
}

fn claim_uid(node: &str, domain: &DemoDomain) -> String {
    format!("claim-{}-{node}", domain.name)
}

fn claim_ref(node: &str, domain: &DemoDomain) -> ClaimRef {
    ClaimRef {
        uid: claim_uid(node, domain),
        namespace: domain.namespace.clone(),
        name: format!("{}-{node}", domain.name),
    }
}
