//! The timer that reads the fabric and hands the daemon each move the rule decides.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use domaind_actors::model::CliqueId;
use domaind_gpu::GpuInventory;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::rule::{CliqueTiming, CliqueTracker, ReadFailure, Verdict};
use super::{CLIQUE_FLAPS, CLIQUE_READ_FAILURES};

/// How long one read of the fabric may take before it counts as failed.
const READ_LIMIT: Duration = Duration::from_secs(30);

/// One read of the node's clique.
#[async_trait]
pub trait FabricReader: Send + Sync + 'static {
    async fn read(&self) -> Result<CliqueId, ReadFailure>;
}

/// The GPU inventory's answer (NVML, or the fake's topology file), asked off the
/// runtime's threads: NVML blocks.
pub struct InventoryReader(pub Arc<dyn GpuInventory>);

impl std::fmt::Debug for InventoryReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InventoryReader").finish_non_exhaustive()
    }
}

#[async_trait]
impl FabricReader for InventoryReader {
    async fn read(&self) -> Result<CliqueId, ReadFailure> {
        let inventory = self.0.clone();
        let asked = tokio::task::spawn_blocking(move || inventory.clique());
        match tokio::time::timeout(READ_LIMIT, asked).await {
            Ok(Ok(Ok(clique))) => Ok(clique),
            Ok(Ok(Err(error))) => Err(ReadFailure {
                kind: error.kind(),
                message: error.to_string(),
            }),
            Ok(Err(error)) => Err(ReadFailure {
                kind: "panicked",
                message: format!("the GPU query panicked: {error}"),
            }),
            Err(_) => Err(ReadFailure {
                kind: "timeout",
                message: format!("the GPU query did not answer within {READ_LIMIT:?}"),
            }),
        }
    }
}

/// The node's fabric registered in another clique: move it from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliqueMove {
    pub from: CliqueId,
    pub to: CliqueId,
}

/// Reads the fabric on the rule's schedule, and at once when `nudge` is notified (the
/// IMEX daemon started failing).
#[derive(Debug)]
pub struct CliqueWatch<R> {
    reader: R,
    tracker: CliqueTracker,
    nudge: Arc<Notify>,
}

impl<R: FabricReader> CliqueWatch<R> {
    pub fn new(reader: R, current: CliqueId, timing: CliqueTiming, nudge: Arc<Notify>) -> Self {
        Self {
            reader,
            tracker: CliqueTracker::new(current, timing),
            nudge,
        }
    }

    /// Runs until `stop`, or until nobody takes the moves any more.
    pub async fn run(mut self, moves: mpsc::Sender<CliqueMove>, stop: CancellationToken) {
        loop {
            let wait = self.tracker.next_read(Instant::now());
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = self.nudge.notified() => {
                    info!(clique = %self.tracker.current(), "the IMEX daemon started failing: reading the NVLink fabric again");
                }
                () = tokio::time::sleep(wait) => {}
            }
            let read = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                read = self.reader.read() => read,
            };
            let current = self.tracker.current().clone();
            match self.tracker.observe(read, Instant::now()) {
                Verdict::Same => debug!(clique = %current, "NVLink clique unchanged"),
                Verdict::Candidate(to) => {
                    info!(clique = %current, read = %to, "the NVLink fabric reads another clique; moving once a read confirms it");
                }
                Verdict::Flapped { dropped, read } => {
                    metrics::counter!(CLIQUE_FLAPS).increment(1);
                    warn!(clique = %current, %dropped, %read, "the NVLink clique read changed again before it was confirmed: staying");
                }
                Verdict::Unreadable(failure) => {
                    metrics::counter!(CLIQUE_READ_FAILURES, "kind" => failure.kind).increment(1);
                    warn!(clique = %current, kind = failure.kind, error = %failure.message, "cannot read the NVLink fabric; keeping the clique");
                }
                Verdict::Move { from, to } => {
                    if moves.send(CliqueMove { from, to }).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    const INTERVAL: Duration = Duration::from_secs(60);

    fn clique(name: &str) -> CliqueId {
        CliqueId(name.into())
    }

    /// FAKE reader: answers from a script, then repeats the last answer; records when
    /// it was asked.
    #[derive(Clone, Default)]
    struct ScriptedReader {
        answers: Arc<Mutex<VecDeque<Result<CliqueId, ReadFailure>>>>,
        asked: Arc<Mutex<Vec<Instant>>>,
    }

    impl ScriptedReader {
        fn new(answers: impl IntoIterator<Item = Result<CliqueId, ReadFailure>>) -> Self {
            Self {
                answers: Arc::new(Mutex::new(answers.into_iter().collect())),
                asked: Arc::default(),
            }
        }

        /// When it was asked, as offsets from `start`.
        fn asked_at(&self, start: Instant) -> Vec<Duration> {
            self.asked
                .lock()
                .unwrap()
                .iter()
                .map(|at| at.duration_since(start))
                .collect()
        }
    }

    #[async_trait]
    impl FabricReader for ScriptedReader {
        async fn read(&self) -> Result<CliqueId, ReadFailure> {
            self.asked.lock().unwrap().push(Instant::now());
            let mut answers = self.answers.lock().unwrap();
            if answers.len() > 1 {
                answers.pop_front().unwrap()
            } else {
                answers.front().cloned().unwrap()
            }
        }
    }

    fn start(
        reader: &ScriptedReader,
        nudge: Arc<Notify>,
    ) -> (mpsc::Receiver<CliqueMove>, CancellationToken) {
        let (moves, taken) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let watch = CliqueWatch::new(
            reader.clone(),
            clique("a.1"),
            CliqueTiming::every(INTERVAL),
            nudge,
        );
        tokio::spawn(watch.run(moves, stop.clone()));
        (taken, stop)
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_clique_is_moved_to_at_the_confirming_read_not_before() {
        let begin = Instant::now();
        let reader = ScriptedReader::new([Ok(clique("a.1")), Ok(clique("b.2"))]);
        let (mut moves, stop) = start(&reader, Arc::default());
        let moved = moves.recv().await.unwrap();
        assert_eq!(
            moved,
            CliqueMove {
                from: clique("a.1"),
                to: clique("b.2")
            }
        );
        // Read at the interval; the new clique seen at 120 s and confirmed 10 s later.
        let s = Duration::from_secs;
        assert_eq!(reader.asked_at(begin), [s(60), s(120), s(130)]);
        assert_eq!(begin.elapsed(), s(130));

        // In the new clique now: the next reads find it unchanged, at the interval.
        tokio::time::sleep(s(125)).await;
        assert_eq!(
            reader.asked_at(begin),
            [s(60), s(120), s(130), s(190), s(250)]
        );
        assert!(moves.try_recv().is_err());
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_imex_failure_reads_the_fabric_at_once() {
        let begin = Instant::now();
        let reader = ScriptedReader::new([Ok(clique("b.2"))]);
        let nudge = Arc::new(Notify::new());
        let (mut moves, stop) = start(&reader, nudge.clone());
        tokio::time::sleep(Duration::from_secs(5)).await;
        nudge.notify_one();
        let moved = moves.recv().await.unwrap();
        assert_eq!(moved.to, clique("b.2"));
        let s = Duration::from_secs;
        // The nudge's read found the candidate; the confirmation came 10 s later.
        assert_eq!(reader.asked_at(begin), [s(5), s(15)]);
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn failed_and_flapping_reads_are_counted_and_never_move_the_node() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let failure = ReadFailure {
            kind: "topology",
            message: "cannot parse the GPU topology file".into(),
        };
        // A fails, a flap (b.2 then back to a.1), garbage, then a.1 for ever.
        let reader = ScriptedReader::new([
            Err(failure.clone()),
            Ok(clique("b.2")),
            Ok(clique("a.1")),
            Ok(CliqueId::default()),
            Ok(clique("a.1")),
        ]);
        let (mut moves, stop) = start(&reader, Arc::default());
        tokio::time::sleep(INTERVAL * 10).await;
        assert!(moves.try_recv().is_err(), "no move");
        stop.cancel();
        tokio::task::yield_now().await;

        let counters = snapshotter.snapshot().into_vec();
        // A counter's value, summed over its label sets that carry `kind` (all if none).
        let count = |name: &str, kind: Option<&str>| -> u64 {
            counters
                .iter()
                .filter(|(key, ..)| key.key().name() == name)
                .filter(|(key, ..)| kind.is_none_or(|k| key.key().labels().any(|l| l.value() == k)))
                .map(|(.., value)| match value {
                    DebugValue::Counter(count) => *count,
                    _ => 0,
                })
                .sum()
        };
        assert_eq!(
            count(CLIQUE_READ_FAILURES, Some("topology")),
            1,
            "{counters:?}"
        );
        assert_eq!(
            count(CLIQUE_READ_FAILURES, Some("fabric_lost")),
            1,
            "{counters:?}"
        );
        assert_eq!(count(CLIQUE_FLAPS, None), 1, "{counters:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_watch_even_mid_read() {
        struct Hung;
        #[async_trait]
        impl FabricReader for Hung {
            async fn read(&self) -> Result<CliqueId, ReadFailure> {
                std::future::pending().await
            }
        }
        let (moves, _taken) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let watch = CliqueWatch::new(
            Hung,
            clique("a.1"),
            CliqueTiming::every(INTERVAL),
            Arc::default(),
        );
        let running = tokio::spawn(watch.run(moves, stop.clone()));
        tokio::time::sleep(INTERVAL * 2).await;
        stop.cancel();
        running.await.unwrap();
    }
}
