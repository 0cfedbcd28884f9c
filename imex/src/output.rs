//! The IMEX daemon's stdout and stderr: forwarded into our log (target
//! `nvidia-imex`) line by line, the last few lines kept so that when the daemon exits
//! on its own the reason can say what it printed last.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::task::JoinHandle;
use tracing::info;

/// Lines kept for the exit reason: enough for an error and its context.
const KEPT_LINES: usize = 5;
/// A kept line is cut to this many characters: the reason goes into logs and /state.
const KEPT_LINE_CHARS: usize = 200;

/// One daemon process's output. Dropping it leaves the forwarding running until the
/// streams end, so that a stopped daemon's last lines still reach the log.
#[derive(Debug, Default)]
pub struct OutputTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl OutputTail {
    /// Starts forwarding `stream` (named `which` in the log).
    pub fn follow(&mut self, stream: impl AsyncRead + Unpin + Send + 'static, which: &'static str) {
        let kept = self.lines.clone();
        self.readers.push(tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                info!(target: "nvidia-imex", stream = which, "{line}");
                let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() == KEPT_LINES {
                    kept.pop_front();
                }
                kept.push_back(line.chars().take(KEPT_LINE_CHARS).collect());
            }
        }));
    }

    /// Follows a freshly spawned child's piped stdout and stderr.
    pub fn of(child: &mut tokio::process::Child) -> Self {
        let mut output = Self::default();
        if let Some(stdout) = child.stdout.take() {
            output.follow(stdout, "stdout");
        }
        if let Some(stderr) = child.stderr.take() {
            output.follow(stderr, "stderr");
        }
        output
    }

    /// The last lines kept so far.
    pub fn snapshot(&self) -> Vec<String> {
        let kept = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().cloned().collect()
    }

    /// The last lines, once the streams have ended or `wait` has passed, keeping the
    /// streams followed.
    pub async fn settled_snapshot(&self, wait: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + wait;
        while !self.readers.iter().all(JoinHandle::is_finished)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.snapshot()
    }

    /// The last lines, once the streams have ended or `wait` has passed: a daemon
    /// that just exited may still have its last words in the pipe.
    pub async fn last_lines(self, wait: Duration) -> Vec<String> {
        let _ = tokio::time::timeout(wait, async {
            for reader in self.readers {
                let _ = reader.await;
            }
        })
        .await;
        let kept = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_the_last_lines_once_the_stream_ends() {
        let mut tail = OutputTail::default();
        let text: String = (1..=7).map(|i| format!("line {i}\n")).collect();
        tail.follow(std::io::Cursor::new(text.into_bytes()), "stdout");
        let lines = tail.last_lines(Duration::from_secs(5)).await;
        assert_eq!(lines, ["line 3", "line 4", "line 5", "line 6", "line 7"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_still_open_does_not_hold_the_answer() {
        let (_writer, reader) = tokio::io::duplex(64);
        let mut tail = OutputTail::default();
        tail.follow(reader, "stderr");
        let lines = tail.last_lines(Duration::from_millis(100)).await;
        assert!(lines.is_empty());
    }
}
