//! The tokio runtime both commands run on.

/// The work of either command (gossip, a few gRPC calls, the API server's watches,
/// reconciles) needs few threads; tokio would start one per CPU, 144 on a GB200 node
/// (a DaemonSet or Deployment without a CPU limit sees them all).
pub const MAX_WORKER_THREADS: usize = 4;

/// A multi-threaded runtime's builder with every driver on and as many workers as this
/// process may use CPUs (its cgroup's quota counted), between 1 and
/// [`MAX_WORKER_THREADS`].
pub fn multi_thread() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(worker_threads()).enable_all();
    builder
}

fn worker_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_WORKER_THREADS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_capped_but_never_none() {
        let workers = worker_threads();
        assert!((1..=MAX_WORKER_THREADS).contains(&workers), "{workers}");
    }
}
