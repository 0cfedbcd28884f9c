//! Device health for the kubelet (`DRAResourceHealth`): what the node feeds the plugin
//! server ([`DeviceHealthFeed`]), and the updates one kubelet stream gets from it.
//!
//! The kubelet reads each response as the plugin's complete list and stamps every entry
//! with the time it received it: an entry not received again within its
//! `health_check_timeout_seconds` counts as Unknown (`pkg/kubelet/cm/dra/healthinfo.go`).
//! So a stream sends the whole list on connect, on every change of the feed, and again
//! [`HEALTH_REFRESH`] after its last send while nothing changes.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::watch;

/// A device's health, as the kubelet's API has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceHealthState {
    Unknown,
    Healthy,
    Unhealthy,
}

/// One device of the driver's ResourceSlices (`pool`, `device`) and its health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealthEntry {
    pub pool: String,
    pub device: String,
    pub health: DeviceHealthState,
    /// Why, for the pod's status; empty for none. Longer than [`MAX_MESSAGE_BYTES`] is
    /// cut (see [`bounded_message`]).
    pub message: String,
    /// When this state was determined, in Unix seconds.
    pub last_updated_unix_s: i64,
}

/// What the plugin server reports: the complete list of the node's devices, replaced
/// whole on every change. A device left out goes Unknown at the kubelet after
/// [`HEALTH_CHECK_TIMEOUT`]. A closed feed (its sender dropped) knows nothing: the
/// streams then send an empty list.
pub type DeviceHealthFeed = watch::Receiver<Arc<Vec<DeviceHealthEntry>>>;

/// A feed with no devices, already closed: the default of a server nobody feeds (the
/// kubelet then has every device Unknown, as it has for a driver without the service).
pub fn no_device_health() -> DeviceHealthFeed {
    watch::channel(Arc::new(Vec::new())).1
}

/// Sent as every entry's `health_check_timeout_seconds`: how long the kubelet trusts an
/// entry after receiving it. The kubelet's own default, said explicitly so that our
/// refresh does not depend on its choice.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// A stream with nothing new sends its list again this long after its last send: a
/// third of [`HEALTH_CHECK_TIMEOUT`], so one late send does not turn devices Unknown.
pub const HEALTH_REFRESH: Duration = Duration::from_secs(10);
/// The API's limit on a message ("at most 1024 characters"). Counted in bytes, which
/// bounds the characters too however the kubelet and the API server count them.
pub const MAX_MESSAGE_BYTES: usize = 1024;
const CUT_MARK: &str = "...";

/// `message` within [`MAX_MESSAGE_BYTES`]: a longer one is cut on a character boundary
/// and ends in "...", as the API describes cutting.
pub fn bounded_message(message: &str) -> Cow<'_, str> {
    if message.len() <= MAX_MESSAGE_BYTES {
        return Cow::Borrowed(message);
    }
    let mut end = MAX_MESSAGE_BYTES - CUT_MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{CUT_MARK}", &message[..end]))
}

/// Why a stream sent its list: a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendReason {
    Connect,
    Change,
    Refresh,
}

impl SendReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SendReason::Connect => "connect",
            SendReason::Change => "change",
            SendReason::Refresh => "refresh",
        }
    }
}

struct Watching<C> {
    feed: DeviceHealthFeed,
    feed_open: bool,
    closed: std::pin::Pin<Box<C>>,
    refresh: Duration,
    next_refresh: std::pin::Pin<Box<tokio::time::Sleep>>,
    connected: bool,
}

impl<C> Watching<C> {
    fn current(&mut self) -> Arc<Vec<DeviceHealthEntry>> {
        if self.feed_open {
            self.feed.borrow_and_update().clone()
        } else {
            Arc::new(Vec::new())
        }
    }
}

/// The lists one kubelet stream sends, each with why: the feed's list at once, then on
/// every change of it and `refresh` after the last send. Ends once `closed` resolves
/// (shutdown began: the kubelet sees a clean end, not an error). Holds no task: dropping
/// it (the kubelet went away) drops everything.
pub(crate) fn updates<C>(
    feed: DeviceHealthFeed,
    closed: C,
    refresh: Duration,
) -> impl Stream<Item = (SendReason, Arc<Vec<DeviceHealthEntry>>)> + Send + 'static
where
    C: Future<Output = ()> + Send + 'static,
{
    let feed_open = feed.has_changed().is_ok();
    let state = Watching {
        feed,
        feed_open,
        closed: Box::pin(closed),
        refresh,
        next_refresh: Box::pin(tokio::time::sleep(refresh)),
        connected: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        let reason = if state.connected {
            tokio::select! {
                biased;
                () = &mut state.closed => return None,
                changed = state.feed.changed(), if state.feed_open => {
                    state.feed_open = changed.is_ok();
                    SendReason::Change
                }
                () = &mut state.next_refresh => SendReason::Refresh,
            }
        } else {
            // A stream opened after shutdown began is refused before it gets here; one
            // that raced it ends at the next turn.
            state.connected = true;
            SendReason::Connect
        };
        let list = state.current();
        let next = tokio::time::Instant::now() + state.refresh;
        state.next_refresh.as_mut().reset(next);
        Some(((reason, list), state))
    })
}

#[cfg(test)]
mod tests;
