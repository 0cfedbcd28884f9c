//! The gossip plane's metrics. Names are Prometheus-style; the exporter lives in the
//! daemon. Every refusal of bad input is counted here with a `reason` label.

/// Connections refused before any frame was accepted.
pub const CONNECTIONS_REFUSED: &str = "domaind_gossip_connections_refused_total";
/// Frames received and dropped because they are malformed, lie about the sender, or
/// would break an invariant chitchat asserts (see `transport::guard`).
pub const FRAMES_REJECTED: &str = "domaind_gossip_frames_rejected_total";
/// Well-formed frames not delivered because a queue was full or a peer unreachable.
pub const FRAMES_DROPPED: &str = "domaind_gossip_frames_dropped_total";
/// Node parts of incoming deltas not applied because their state is not signed by its
/// owner, or would take back what this node holds (see `signed`); `stale` counts
/// values older than those held, which chitchat ignores, and `own_state` this node's
/// own state relayed back to it (stripped, honest).
pub const STATE_REFUSED: &str = "domaind_gossip_state_refused_total";
/// Values this node signed and published (its own writes, and re-signing after a
/// certificate rotation).
pub const STATE_SIGNED: &str = "domaind_gossip_state_signed_total";
pub const FRAMES_SENT: &str = "domaind_gossip_frames_sent_total";
pub const FRAMES_RECEIVED: &str = "domaind_gossip_frames_received_total";
pub const BYTES_SENT: &str = "domaind_gossip_bytes_sent_total";
pub const BYTES_RECEIVED: &str = "domaind_gossip_bytes_received_total";
pub const CONNECT_FAILURES: &str = "domaind_gossip_connect_failures_total";
pub const TLS_RELOADS: &str = "domaind_gossip_tls_reloads_total";
/// When the certificates in use expire, in seconds since the Unix epoch, by `cert`:
/// `node` (this node's gossip certificate) and `ca` (the earliest of the CA file's).
/// Set at load and at every rotation; `... - time()` is the time left.
pub const CERT_EXPIRY: &str = "domaind_gossip_cert_expiry_timestamp_seconds";
/// Messages of another gossip cluster (another clique) dropped before chitchat, by
/// `kind`: `syn` (a peer that has us as a seed), `bad_cluster` (a peer refusing ours).
/// Zero at steady state; anything else is a stale or misconfigured seed.
pub const FOREIGN_CLUSTER: &str = "domaind_gossip_foreign_cluster_total";
/// What this node read of a newer version than its own, by `format`: `frame`, `pulse`
/// (each one), `envelope` (each signed value), `checkpoint` (each journal record),
/// `run_json` (each read). Read as far as this version understands it, never refused
/// for the version alone (see `version`). Not only gossip's: the checkpoint and run.json
/// count here too. Nonzero during a rolling upgrade; after one, a node left behind.
pub const NEWER_VERSION: &str = "domaind_newer_version_total";

/// Gives every gossip metric its help text (`# HELP` on `/metrics`, and the book's
/// metrics reference); the daemon calls it once, after installing its recorder.
pub fn describe() {
    use crate::eager::EAGER_PUSHES;
    use crate::pulse::{MENDS, NODES_SILENT, PEERS_GONE, PULSES_REFUSED};
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Gossip connections refused before any frame, by `reason`: `no_client_cert`, \
         `unknown_ca`, `expired`, `tls_error`, `handshake_aborted`, `handshake_timeout`, \
         `bad_identity`, `connection_limit`."
    );
    describe_counter!(
        FRAMES_REJECTED,
        "Gossip frames refused, closing their connection, by `reason`: `oversized`, \
         `truncated`, `malformed`, `identity_mismatch`, `address_mismatch`, \
         `version_above_max`, `delta_about_receiver` (the last two would have tripped an \
         assertion inside chitchat)."
    );
    describe_counter!(
        FRAMES_DROPPED,
        "Well-formed gossip frames not delivered, by `reason`: `queue_full`, \
         `peer_unreachable`, `write_failed`, `inbound_queue_full` (received faster than \
         the gossip loop takes them: past the count or byte budget), `oversized_outbound`."
    );
    describe_counter!(
        STATE_REFUSED,
        "Another node's gossip state refused, by `reason`: because its owner did not sign it \
         (`unsigned`, `bad_signature`, `wrong_signer`, `untrusted_certificate`, \
         `unknown_signer`, `unsigned_tombstone`, `unsigned_max_version`, \
         `reset_without_certificate`) or because it would take back what this node holds \
         (`rollback`); alert on these, which mean a peer forges state. `stale` counts old \
         values chitchat ignores anyway (common: exchanges cross), `own_state` this node's \
         own state relayed back by a peer, stripped and honest."
    );
    describe_counter!(
        STATE_SIGNED,
        "Gossip values this node signed: its writes, and all of them again after a \
         certificate rotation."
    );
    describe_counter!(FRAMES_SENT, "Gossip frames sent.");
    describe_counter!(FRAMES_RECEIVED, "Gossip frames received.");
    describe_counter!(BYTES_SENT, "Gossip bytes sent.");
    describe_counter!(BYTES_RECEIVED, "Gossip bytes received.");
    describe_counter!(
        CONNECT_FAILURES,
        "Outbound gossip connects that failed or timed out."
    );
    describe_counter!(
        TLS_RELOADS,
        "Reloads of the gossip certificates, by `result`: `rotated`, `refused`."
    );
    describe_gauge!(
        CERT_EXPIRY,
        "When the gossip certificates in use expire, in Unix seconds, by `cert`: `node`, \
         `ca` (the earliest of the CA file's); set at load and at each rotation."
    );
    describe_counter!(
        FOREIGN_CLUSTER,
        "Messages of another clique's gossip dropped unanswered, by `kind`: `syn` (a peer \
         that has us as a seed), `bad_cluster` (a peer refusing ours). 0 at steady state; \
         anything else is a stale or misconfigured seed."
    );
    describe_counter!(
        NEWER_VERSION,
        "What this node read of a newer version than its own, as far as it understands it \
         (never refused for that), by `format`: `frame`, `pulse`, `envelope` (signed \
         values), `checkpoint` (journal records), `run_json` (reads). Nonzero during a \
         rolling upgrade; afterwards, a node left behind."
    );
    describe_counter!(
        EAGER_PUSHES,
        "Gossip exchanges started between rounds to pass news on (none while nothing \
         changes)."
    );
    describe_counter!(
        PULSES_REFUSED,
        "Liveness pulses dropped unread, by `reason`: `malformed`, `oversized`."
    );
    describe_counter!(
        MENDS,
        "Gossip exchanges started because a pulse showed a peer holding other state (a \
         join, a missed push); none at steady state."
    );
    describe_counter!(
        NODES_SILENT,
        "Clique-mates this node stopped counting as live: no pulse and no news of them for \
         the dead-after time (`--gossip-dead-after`), or gone."
    );
    describe_counter!(
        PEERS_GONE,
        "Clique-mates found gone and dead at once: their connection closed and a dial found \
         nothing listening (a crash, a kill, a stop)."
    );
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedConnection {
    /// The client sent no certificate.
    NoClientCert,
    /// The client's certificate does not chain to our CA.
    UnknownCa,
    /// The client's certificate has expired or is not yet valid.
    Expired,
    /// Another TLS failure (bad signature, protocol error, wrong version...).
    TlsError,
    /// The peer closed or sent garbage before finishing the handshake.
    HandshakeAborted,
    /// The peer did not finish the handshake in time.
    HandshakeTimeout,
    /// The certificate names no node, or several.
    BadIdentity,
    /// Too many connections from one address, or in all.
    ConnectionLimit,
}

impl RefusedConnection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoClientCert => "no_client_cert",
            Self::UnknownCa => "unknown_ca",
            Self::Expired => "expired",
            Self::TlsError => "tls_error",
            Self::HandshakeAborted => "handshake_aborted",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::BadIdentity => "bad_identity",
            Self::ConnectionLimit => "connection_limit",
        }
    }
}

pub(crate) fn connection_refused(reason: RefusedConnection) {
    metrics::counter!(CONNECTIONS_REFUSED, "reason" => reason.as_str()).increment(1);
}

pub(crate) fn frame_rejected(reason: &'static str) {
    metrics::counter!(FRAMES_REJECTED, "reason" => reason).increment(1);
}

pub(crate) fn frame_dropped(reason: &'static str) {
    metrics::counter!(FRAMES_DROPPED, "reason" => reason).increment(1);
}

pub(crate) fn frame_sent(bytes: usize) {
    metrics::counter!(FRAMES_SENT).increment(1);
    metrics::counter!(BYTES_SENT).increment(bytes as u64);
}

pub(crate) fn frame_received(bytes: usize) {
    metrics::counter!(FRAMES_RECEIVED).increment(1);
    metrics::counter!(BYTES_RECEIVED).increment(bytes as u64);
}

pub(crate) fn connect_failed() {
    metrics::counter!(CONNECT_FAILURES).increment(1);
}

pub(crate) fn cert_expiry(expiry: crate::tls::Expiry) {
    // f64 holds every second up to year 285 million exactly.
    metrics::gauge!(CERT_EXPIRY, "cert" => "node").set(expiry.node_cert as f64);
    metrics::gauge!(CERT_EXPIRY, "cert" => "ca").set(expiry.ca as f64);
}

pub(crate) fn tls_reload(result: &'static str) {
    metrics::counter!(TLS_RELOADS, "result" => result).increment(1);
}

pub(crate) fn state_refused(reason: &'static str, count: usize) {
    metrics::counter!(STATE_REFUSED, "reason" => reason).increment(count as u64);
}

pub(crate) fn foreign_cluster(kind: &'static str) {
    metrics::counter!(FOREIGN_CLUSTER, "kind" => kind).increment(1);
}

pub(crate) fn state_signed(count: usize) {
    metrics::counter!(STATE_SIGNED).increment(count as u64);
}

/// For every reader of a versioned format, the node crate's included.
pub fn newer_version(format: &'static str, count: usize) {
    metrics::counter!(NEWER_VERSION, "format" => format).increment(count as u64);
}

/// The counter `name` with `format` as its label, as `snapshotter`'s recorder counted it.
#[cfg(test)]
pub(crate) fn counted(
    snapshotter: &metrics_util::debugging::Snapshotter,
    name: &str,
    format: &str,
) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key().name() == name
                && key
                    .key()
                    .labels()
                    .any(|label| label.key() == "format" && label.value() == format)
        })
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}
