//! The thread that forks the IMEX daemon.
//!
//! The kernel sends a child its parent-death signal when the *thread* that forked it
//! exits, not when the process does ([`super::guard`]). Forked from wherever the
//! adapter's future happens to run, the daemon could be killed by a worker or
//! blocking-pool thread ending (tokio ends idle blocking threads after seconds), or
//! outlive nothing it should. So every daemon is forked from one thread of the
//! adapter's own, which ends only when the adapter is dropped, by which time its
//! children are being killed anyway.

use std::sync::Mutex;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

struct Job {
    command: Command,
    /// The runtime whose process driver reaps the child: the caller's.
    runtime: tokio::runtime::Handle,
    answer: oneshot::Sender<std::io::Result<Child>>,
}

/// Forks commands from a thread that lives as long as this value.
#[derive(Debug)]
pub struct Spawner {
    /// `None` when the thread could not be started: every spawn says why.
    jobs: Result<Mutex<mpsc::Sender<Job>>, String>,
}

impl Default for Spawner {
    fn default() -> Self {
        Self::new()
    }
}

impl Spawner {
    pub fn new() -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("imex-spawner".into())
            .spawn(move || {
                // Ends when the last sender is dropped, with the adapter.
                for job in queue {
                    let _runtime = job.runtime.enter();
                    let mut command = job.command;
                    // If the caller stopped waiting, the child is dropped here and
                    // `kill_on_drop` ends it.
                    let _ = job.answer.send(command.spawn());
                }
            });
        Self {
            jobs: thread
                .map(|_| Mutex::new(jobs))
                .map_err(|error| format!("cannot start the thread that starts IMEX: {error}")),
        }
    }

    /// Spawns `command` from the spawner's thread, in the caller's runtime.
    pub async fn spawn(&self, command: Command) -> std::io::Result<Child> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            command,
            runtime: tokio::runtime::Handle::current(),
            answer,
        };
        let jobs = self
            .jobs
            .as_ref()
            .map_err(|error| std::io::Error::other(error.clone()))?;
        jobs.lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|_| std::io::Error::other("the thread that starts IMEX has ended"))?;
        answered
            .await
            .map_err(|_| std::io::Error::other("the thread that starts IMEX has ended"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_forked_by_the_spawner_is_reaped_by_the_caller() {
        let spawner = Spawner::new();
        let mut command = Command::new("sh");
        command.args(["-c", "exit 3"]);
        let mut child = spawner.spawn(command).await.unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_missing_program_is_the_spawn_error() {
        let spawner = Spawner::new();
        let error = spawner
            .spawn(Command::new("/nonexistent/imex"))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    }
}
