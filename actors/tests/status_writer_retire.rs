//! A status writer retired when its domain leaves the node writes nothing more: not a
//! write it was holding, not a status published after, and `Retire` answers only once
//! a write already in flight has landed. Otherwise the reporter's last write could land
//! after the last member's vacated status (seen on a real cluster: `Ready 1/1` left
//! behind once the workload was gone).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use domaind_actors::actors::status_writer::{PublishStatus, Retire, StatusWriterActor};
use domaind_actors::model::{DomainRef, DomainUid};
use domaind_actors::ports::{PortError, StatusSink};
use domaind_actors::rules::status::{DomainStatus, vacated_document};
use domaind_actors::rules::status_writes::StatusWrites;
use domaind_actors::testing::{FakeEventSink, FakeGossipNet, FakeStatusSink, run_paused_actix};
use tokio::sync::Semaphore;

const QUIET: Duration = Duration::from_millis(200);
const MAX_DELAY: Duration = Duration::from_secs(3);

fn domain() -> DomainRef {
    DomainRef {
        uid: DomainUid("cd-1".into()),
        namespace: "team-a".into(),
        name: "training".into(),
        num_nodes: 0,
    }
}

/// A sink whose writes wait for a permit: a write in flight, held as long as the test
/// wants.
#[derive(Debug, Clone)]
struct GatedSink {
    inner: FakeStatusSink,
    permits: Arc<Semaphore>,
}

#[async_trait]
impl StatusSink for GatedSink {
    async fn write(&self, domain: &DomainRef, status: &DomainStatus) -> Result<(), PortError> {
        self.permits.acquire().await.expect("open").forget();
        self.inner.write(domain, status).await
    }

    async fn read(&self, domain: &DomainRef) -> Result<Option<DomainStatus>, PortError> {
        self.inner.read(domain).await
    }
}

fn writer(sink: Arc<dyn StatusSink>) -> Addr<StatusWriterActor> {
    let net = FakeGossipNet::default();
    StatusWriterActor::new(
        domain(),
        sink,
        Arc::new(FakeEventSink::default()),
        Arc::new(net.join("node-a", 1)),
        StatusWrites::new(QUIET, MAX_DELAY, None, 1),
    )
    .start()
}

#[test]
fn a_held_write_is_dropped_and_nothing_is_written_after_retiring() {
    run_paused_actix(|| async {
        let sink = FakeStatusSink::default().for_node("node-a");
        let writer = writer(Arc::new(sink.clone()));
        writer
            .send(PublishStatus(vacated_document()))
            .await
            .unwrap();
        writer.send(Retire).await.unwrap();
        tokio::time::sleep(MAX_DELAY * 2).await;
        assert!(sink.writes().is_empty(), "{:?}", sink.writes());
        // Retired, it stopped: later publishes go nowhere.
        assert!(
            writer
                .send(PublishStatus(vacated_document()))
                .await
                .is_err()
        );
        tokio::time::sleep(MAX_DELAY * 2).await;
        assert!(sink.writes().is_empty());
    });
}

#[test]
fn retiring_waits_for_the_write_in_flight() {
    run_paused_actix(|| async {
        let inner = FakeStatusSink::default().for_node("node-a");
        let permits = Arc::new(Semaphore::new(0));
        let sink = GatedSink {
            inner: inner.clone(),
            permits: permits.clone(),
        };
        let writer = writer(Arc::new(sink));
        writer
            .send(PublishStatus(vacated_document()))
            .await
            .unwrap();
        // The quiet period passes: the write starts and waits for its permit.
        tokio::time::sleep(QUIET * 2).await;
        let retired = tokio::spawn(writer.send(Retire));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !retired.is_finished(),
            "Retire answered with a write in flight"
        );
        permits.add_permits(1);
        retired.await.unwrap().unwrap();
        assert_eq!(
            inner.writes().len(),
            1,
            "the write in flight landed, before the answer"
        );
    });
}
