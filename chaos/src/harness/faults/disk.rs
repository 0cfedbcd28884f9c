//! The state directory fills up for a while: a node's tmpfs state directory (see
//! `crate::statedir`) is filled to the last byte, a new claim of the domain is prepared
//! and unprepared on that node meanwhile, as the kubelet of a new pod would, and after
//! the hold the space comes back. Prepares must go on while the directory is full:
//! each call answered with success before the space returns, or it is a violation.
//! The checkpoint file may lag meanwhile (the invariant allows it while full and for
//! the grace after); `/state`, agreement, status and isolation may not, and no daemon
//! may die. Nothing changes membership, so IMEX's files, in the same directory, need
//! no write while it is full.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use domaind_kubelet_plugin::DraVersion;
use domaind_kubelet_plugin::client::KubeletClient;

use super::skipped;
use crate::harness::claims::{claim_file, claim_ref};
use crate::harness::{Harness, PREPARE_LIMIT};
use crate::invariants::ClaimPhase;
use crate::report::FaultRecord;
use crate::schedule::Step;

/// What the calls made while the directory was full answered: how long each took, or
/// its error.
#[derive(Debug)]
struct WhileFull {
    prepare: Result<Duration, String>,
    /// Only after a prepare that succeeded.
    unprepare: Option<Result<Duration, String>>,
}

impl Harness {
    pub(super) async fn disk_full(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let dir = self.rack.node(target).state_dir();
        let filled = match &self.disks {
            Ok(disks) => disks.fill(&dir),
            Err(reason) => Err(anyhow::anyhow!("{reason}")),
        };
        let bytes = match filled {
            Ok(bytes) => bytes,
            Err(error) => {
                self.free_state_dir(target, &dir);
                return skipped(record, error);
            }
        };
        self.world.set_state_dir_full(target, true, Instant::now());
        record.notes.push(format!(
            "state directory full ({} KiB written)",
            bytes >> 10
        ));

        let uid = format!("full-{}-{}", step.index, self.name(target));
        if let Err(error) = self
            .rack
            .local()
            .write_claim(&claim_file(&self.domain, &uid))
        {
            self.liveness(Some(target), format!("cannot write claim {uid}: {error}"));
        }
        self.world
            .set_claim(target, &uid, ClaimPhase::Preparing, Instant::now());
        let socket = self.rack.node(target).dra_socket();
        let calls = tokio::spawn(prepare_then_unprepare(socket, uid.clone()));
        self.hold(step.hold, |_, _, _| false).await;

        let answered = if calls.is_finished() {
            calls.await.unwrap_or_else(|error| {
                WhileFull::failed(format!("the calls' task failed: {error}"))
            })
        } else {
            calls.abort();
            WhileFull::failed(format!(
                "no answer in the {} ms the directory stayed full",
                step.hold.as_millis()
            ))
        };
        let ended = Instant::now();
        self.free_state_dir(target, &dir);
        self.world.set_state_dir_full(target, false, ended);
        self.judge(target, &uid, &answered, &mut record);
        self.settle_extra_claim(target, &uid).await;
        self.heal_fault(record, ended, "space returned to its state directory")
            .await
    }

    fn free_state_dir(&mut self, target: usize, dir: &std::path::Path) {
        let freed = match &self.disks {
            Ok(disks) => disks.free(dir),
            Err(_) => Ok(()),
        };
        if let Err(error) = freed {
            self.liveness(
                Some(target),
                format!("cannot free its state directory: {error:#}"),
            );
        }
    }

    /// The calls' answers into the world, the record's notes, and violations.
    fn judge(&mut self, target: usize, uid: &str, answered: &WhileFull, record: &mut FaultRecord) {
        let now = Instant::now();
        match &answered.prepare {
            Ok(took) => {
                self.world.set_claim(target, uid, ClaimPhase::Prepared, now);
                record.notes.push(format!(
                    "{uid} prepared in {} ms while full",
                    took.as_millis()
                ));
            }
            Err(error) => self.liveness(
                Some(target),
                format!(
                    "with its state directory full, the prepare of {uid} did not succeed: {error}"
                ),
            ),
        }
        match &answered.unprepare {
            Some(Ok(took)) => {
                self.world.set_claim(target, uid, ClaimPhase::Released, now);
                let _ = self.rack.local().remove_claim(uid);
                record.notes.push(format!(
                    "{uid} unprepared in {} ms while full",
                    took.as_millis()
                ));
            }
            Some(Err(error)) => self.liveness(
                Some(target),
                format!(
                    "with its state directory full, the unprepare of {uid} did not succeed: {error}"
                ),
            ),
            None => {}
        }
    }

    /// The kubelet's retries once there is room: the extra claim prepared if it was not,
    /// then unprepared, so that the node holds what it held before the fault.
    async fn settle_extra_claim(&mut self, target: usize, uid: &str) {
        match self.world.nodes[target].claims.get(uid) {
            Some(ClaimPhase::Released) | None => return,
            Some(ClaimPhase::Prepared) => {}
            Some(_) => {
                self.begin_prepare(target, uid);
                self.wait_until(PREPARE_LIMIT, |h, _, _| h.prepares.is_empty())
                    .await;
            }
        }
        self.unprepare(target, uid).await;
    }
}

impl WhileFull {
    fn failed(error: String) -> Self {
        Self {
            prepare: Err(error),
            unprepare: None,
        }
    }
}

/// A prepare of `uid` on the node's DRA socket, then, if it succeeded, its unprepare:
/// one call each, as a kubelet makes them.
async fn prepare_then_unprepare(socket: PathBuf, uid: String) -> WhileFull {
    let claim = [claim_ref(&uid)];
    let client = match KubeletClient::connect(socket).await {
        Ok(client) => client,
        Err(error) => return WhileFull::failed(format!("{error:#}")),
    };
    let started = Instant::now();
    let prepare = async {
        let mut answers = client.prepare(&claim, DraVersion::V1).await?;
        anyhow::Ok(answers.pop().context("no answer for the claim")?.result)
    }
    .await;
    let prepare = match prepare {
        Ok(Ok(_)) => Ok(started.elapsed()),
        Ok(Err(error)) => Err(error),
        Err(error) => Err(format!("{error:#}")),
    };
    if prepare.is_err() {
        return WhileFull {
            prepare,
            unprepare: None,
        };
    }
    let started = Instant::now();
    let unprepare = async {
        let mut answers = client.unprepare(&claim, DraVersion::V1).await?;
        anyhow::Ok(answers.pop().context("no answer for the claim")?.result)
    }
    .await;
    let unprepare = match unprepare {
        Ok(Ok(())) => Ok(started.elapsed()),
        Ok(Err(error)) => Err(error),
        Err(error) => Err(format!("{error:#}")),
    };
    WhileFull {
        prepare,
        unprepare: Some(unprepare),
    }
}
