//! The actors, each owning one thing (see docs/ARCHITECTURE.md for the whole picture):
//!
//! | actor | one per | owns |
//! |---|---|---|
//! | [`node::NodeActor`] | node | config, checkpoint, routing of prepare/unprepare, one-domain rule |
//! | [`gossip_bridge::GossipBridge`] | node | gossip's change stream, as messages |
//! | [`domain::DomainActor`] | domain on the node | advertisement, members, slots, peer set, readiness |
//! | [`channel::ChannelActor`] | prepared claim | answering the kubelet once the readiness policy holds |
//! | [`imex_peer::ImexPeerActor`] | remote member | drop and re-admit decisions |
//! | [`imex_process::ImexProcessActor`] | node | the IMEX daemon: start, apply, restart, readiness |
//! | [`status_writer::StatusWriterActor`] | domain, on its reporter | coalesced status writes |
//! //! | [`domain::DomainActor`] as the shared IMEX domain ([`sharing`]) | clique, on a node holding a domain of `isolation: Channel` | the IMEX daemon for every sharing domain, their channels |
//! | [`last_out::LastOut`] (a task) | domain, on a node its workload left | the vacated status, if this node was the last member |

pub mod channel;
pub mod domain;
pub mod gossip_bridge;
pub mod imex_peer;
pub mod imex_process;
pub mod last_out;
pub mod node;
pub mod sharing;
pub mod status_writer;

/// Gives the actors' metrics their help text (`# HELP` on `/metrics`, and the book's
/// metrics reference); the daemon calls it once, after installing its recorder.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        domain::BAD_ADVERTISEMENTS,
        "Domain advertisements in gossip that could not be read, skipped when computing the \
         members."
    );
    describe_counter!(
        domain::CHANNELS_EXHAUSTED,
        "`isolation: Channel` domains that found every channel of the clique's shared IMEX \
         domain taken (once per episode)."
    );
    describe_counter!(
        domain::CHANNEL_CONFLICTS,
        "A sharing domain's confirmed channel moved while this node's pods held the old one \
         (a partition healed)."
    );
    describe_counter!(
        imex_peer::PEERS_HELD,
        "Peers kept in their domain while their daemon was silent, because this node's IMEX \
         still reached theirs: each is a restart that no job felt."
    );
    describe_counter!(
        imex_process::IMEX_RESTARTS,
        "IMEX daemon restarts scheduled, by `cause`: `exited` (it ended on its own), \
         `start_failed` (it could not be started)."
    );
    describe_gauge!(
        imex_process::IMEX_RESTART_BACKOFF,
        "Seconds the next IMEX restart waits; 0 while the daemon runs or nothing waits."
    );
    describe_counter!(
        imex_process::IMEX_STATUS_QUERIES,
        "Status questions asked of the IMEX daemon (each runs its status tool once or twice)."
    );
    describe_gauge!(
        imex_process::IMEX_FAILING,
        "1 while the IMEX daemon is failing: it exited or could not start, and no daemon has \
         stayed up long enough since."
    );
    describe_counter!(
        node::PREPARES,
        "Claims the node was asked to prepare, by `outcome`: `prepared`, `retry` (the kubelet \
         asks again), `refused`."
    );
    describe_counter!(
        node::CHECKPOINT_FAILURES,
        "Changes the checkpoint store refused, or a checkpoint that could not be loaded (a \
         journal of a newer domaind)."
    );
    describe_counter!(
        status_writer::STATUS_WRITE_FAILURES,
        "Domain status writes that failed (retried); successful ones are counted in \
         `domaind_status_writes_total`."
    );
    describe_counter!(
        status_writer::STATUS_REWRITES,
        "Domain status writes repeated because another node's write landed after ours."
    );
}
