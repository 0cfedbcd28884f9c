use std::pin::pin;

use futures::StreamExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;

fn entry(device: &str, health: DeviceHealthState) -> DeviceHealthEntry {
    DeviceHealthEntry {
        pool: "node-a".into(),
        device: device.into(),
        health,
        message: String::new(),
        last_updated_unix_s: 1_700_000_000,
    }
}

fn devices(list: &[DeviceHealthEntry]) -> Vec<(String, DeviceHealthState)> {
    list.iter().map(|e| (e.device.clone(), e.health)).collect()
}

/// A shutdown signal the test fires.
fn shutdown() -> (
    oneshot::Sender<()>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (fire, fired) = oneshot::channel::<()>();
    (fire, async move {
        let _ = fired.await;
    })
}

#[tokio::test(start_paused = true)]
async fn sends_the_list_on_connect_on_each_change_and_refreshes_when_quiet() {
    let (feed, watched) = watch::channel(Arc::new(vec![entry(
        "channel-0",
        DeviceHealthState::Healthy,
    )]));
    let (_fire, closed) = shutdown();
    let mut stream = pin!(updates(watched, closed, HEALTH_REFRESH));
    let started = Instant::now();

    let (reason, list) = stream.next().await.unwrap();
    assert_eq!(reason, SendReason::Connect);
    assert_eq!(
        devices(&list),
        [("channel-0".into(), DeviceHealthState::Healthy)]
    );
    assert_eq!(started.elapsed(), Duration::ZERO);

    tokio::time::advance(Duration::from_secs(4)).await;
    feed.send_replace(Arc::new(vec![
        entry("channel-0", DeviceHealthState::Unhealthy),
        entry("channel-1", DeviceHealthState::Unknown),
    ]));
    let (reason, list) = stream.next().await.unwrap();
    assert_eq!(reason, SendReason::Change);
    assert_eq!(
        devices(&list),
        [
            ("channel-0".into(), DeviceHealthState::Unhealthy),
            ("channel-1".into(), DeviceHealthState::Unknown),
        ]
    );
    assert_eq!(started.elapsed(), Duration::from_secs(4));

    // Quiet: the same list again, a refresh after the last send, and every refresh after.
    for n in 1..=3 {
        let (reason, list) = stream.next().await.unwrap();
        assert_eq!(reason, SendReason::Refresh);
        assert_eq!(list.len(), 2);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(4) + HEALTH_REFRESH * n
        );
    }
    const { assert!(HEALTH_REFRESH.as_secs() * 2 < HEALTH_CHECK_TIMEOUT.as_secs()) };
}

#[tokio::test(start_paused = true)]
async fn changes_in_a_burst_send_the_latest_list() {
    let (feed, watched) = watch::channel(Arc::new(Vec::new()));
    let (_fire, closed) = shutdown();
    let mut stream = pin!(updates(watched, closed, HEALTH_REFRESH));
    assert!(stream.next().await.unwrap().1.is_empty());
    for device in ["a", "b", "c"] {
        feed.send_replace(Arc::new(vec![entry(device, DeviceHealthState::Healthy)]));
    }
    let (reason, list) = stream.next().await.unwrap();
    assert_eq!(reason, SendReason::Change);
    assert_eq!(devices(&list), [("c".into(), DeviceHealthState::Healthy)]);
    // Nothing more until the refresh.
    let started = Instant::now();
    let (reason, _) = stream.next().await.unwrap();
    assert_eq!(reason, SendReason::Refresh);
    assert_eq!(started.elapsed(), HEALTH_REFRESH);
}

#[tokio::test(start_paused = true)]
async fn a_closed_feed_knows_nothing() {
    let (feed, watched) = watch::channel(Arc::new(vec![entry(
        "channel-0",
        DeviceHealthState::Healthy,
    )]));
    let (_fire, closed) = shutdown();
    let mut stream = pin!(updates(watched, closed, HEALTH_REFRESH));
    assert_eq!(stream.next().await.unwrap().1.len(), 1);
    drop(feed);
    let (reason, list) = stream.next().await.unwrap();
    assert_eq!(reason, SendReason::Change);
    assert!(list.is_empty());
    let (reason, list) = stream.next().await.unwrap();
    assert_eq!(reason, SendReason::Refresh);
    assert!(list.is_empty());

    // The default feed is closed from the start: one empty list, then refreshes.
    let (_fire, closed) = shutdown();
    let mut stream = pin!(updates(no_device_health(), closed, HEALTH_REFRESH));
    let started = Instant::now();
    assert_eq!(
        stream.next().await.unwrap(),
        (SendReason::Connect, Arc::default())
    );
    assert_eq!(stream.next().await.unwrap().0, SendReason::Refresh);
    assert_eq!(started.elapsed(), HEALTH_REFRESH);
}

#[tokio::test(start_paused = true)]
async fn ends_when_shutdown_begins() {
    let (_feed, watched) = watch::channel(Arc::new(Vec::new()));
    let (fire, closed) = shutdown();
    let mut stream = pin!(updates(watched, closed, HEALTH_REFRESH));
    assert_eq!(stream.next().await.unwrap().0, SendReason::Connect);
    let started = Instant::now();
    tokio::time::advance(Duration::from_secs(3)).await;
    fire.send(()).unwrap();
    assert!(stream.next().await.is_none());
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[test]
fn messages_are_cut_to_1024_bytes_on_a_char_boundary() {
    let fits = "x".repeat(MAX_MESSAGE_BYTES);
    assert!(matches!(bounded_message(&fits), Cow::Borrowed(m) if m == fits));
    assert_eq!(bounded_message(""), "");

    let long = "y".repeat(MAX_MESSAGE_BYTES + 1);
    let cut = bounded_message(&long);
    assert_eq!(cut.len(), MAX_MESSAGE_BYTES);
    assert_eq!(cut, format!("{}...", "y".repeat(MAX_MESSAGE_BYTES - 3)));

    // Three bytes a character: 1021 bytes is not a boundary; the cut falls back to
    // 1020 (340 characters), and the message stays valid UTF-8.
    let wide = "€".repeat(400);
    let cut = bounded_message(&wide);
    assert_eq!(cut, format!("{}...", "€".repeat(340)));
    assert!(cut.len() <= MAX_MESSAGE_BYTES);
    assert!(cut.chars().count() <= MAX_MESSAGE_BYTES);
}
