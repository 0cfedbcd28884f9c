//! The core's health view, as the kubelet plugin's health stream reports it: one entry
//! per device of our ResourceSlices that a claim here holds.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use domaind_actors::rules::channel_health::ChannelHealth;
use domaind_actors::{HealthBoard, HealthView};
use domaind_kubelet_plugin::{DeviceHealthEntry, DeviceHealthFeed, DeviceHealthState};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The kubelet's list for `view`. A device held by several claims (a workload's and
/// an adminAccess one's) is listed once, with the first claim's health: they share
/// the device, and so its domain.
pub fn entries(view: &HealthView, now_unix_s: i64) -> Vec<DeviceHealthEntry> {
    let mut listed = BTreeSet::new();
    view.devices
        .iter()
        .filter(|d| listed.insert((d.device.pool.clone(), d.device.device.clone())))
        .map(|d| DeviceHealthEntry {
            pool: d.device.pool.clone(),
            device: d.device.device.clone(),
            health: match d.health() {
                ChannelHealth::Unknown => DeviceHealthState::Unknown,
                ChannelHealth::Healthy => DeviceHealthState::Healthy,
                ChannelHealth::Unhealthy(_) => DeviceHealthState::Unhealthy,
            },
            message: d.health().message().to_owned(),
            last_updated_unix_s: now_unix_s,
        })
        .collect()
}

/// A feed following `board`: ends when the board's last publisher goes, or nobody
/// reads the feed any more.
pub fn follow(board: &HealthBoard) -> (DeviceHealthFeed, JoinHandle<()>) {
    let mut views = board.subscribe();
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    };
    let (tx, feed) = watch::channel(Arc::new(entries(&views.borrow_and_update(), now())));
    let task = tokio::spawn(async move {
        while views.changed().await.is_ok() {
            let list = entries(&views.borrow_and_update(), now());
            if tx.send(Arc::new(list)).is_err() {
                return;
            }
        }
    });
    (feed, task)
}

#[cfg(test)]
mod tests {
    use domaind_actors::PreparedDevice;
    use domaind_actors::model::{AllocatedDevice, ClaimRef, DomainRef};
    use domaind_actors::rules::channel_health::DomainHealth;

    use super::*;

    fn device(claim: &str, name: &str, health: Option<ChannelHealth>) -> PreparedDevice {
        PreparedDevice {
            claim: ClaimRef {
                uid: claim.into(),
                namespace: "ns".into(),
                name: claim.into(),
            },
            device: AllocatedDevice {
                request: "channel".into(),
                pool: "node-1".into(),
                device: name.into(),
            },
            domain: DomainRef {
                uid: domaind_actors::model::DomainUid("cd".into()),
                namespace: "ns".into(),
                name: "cd".into(),
                num_nodes: 2,
            },
            status: health.map(|health| DomainHealth {
                health,
                ..DomainHealth::default()
            }),
        }
    }

    #[test]
    fn each_device_once_with_its_health_and_why() {
        let view = HealthView {
            devices: vec![
                device(
                    "a",
                    "channel-0",
                    Some(ChannelHealth::Unhealthy("IMEX down".into())),
                ),
                device("admin", "channel-0", Some(ChannelHealth::Healthy)),
                device("b", "channel-1", None),
            ],
            imex_failing: None,
        };
        let list = entries(&view, 7);
        assert_eq!(list.len(), 2, "{list:?}");
        assert_eq!(list[0].device, "channel-0");
        assert_eq!(list[0].health, DeviceHealthState::Unhealthy);
        assert_eq!(list[0].message, "IMEX down");
        assert_eq!(list[1].health, DeviceHealthState::Unknown);
        assert_eq!(list[1].last_updated_unix_s, 7);
    }

    #[tokio::test]
    async fn the_feed_follows_the_board_and_ends_with_it() {
        let board = HealthBoard::default();
        let (mut feed, task) = follow(&board);
        assert!(feed.borrow_and_update().is_empty());
        board.publish(HealthView {
            devices: vec![device("a", "channel-0", Some(ChannelHealth::Healthy))],
            imex_failing: None,
        });
        feed.changed().await.unwrap();
        assert_eq!(
            feed.borrow_and_update()[0].health,
            DeviceHealthState::Healthy
        );
        drop(board);
        task.await.unwrap();
        assert!(
            feed.changed().await.is_err(),
            "the feed closes with the board"
        );
    }
}
