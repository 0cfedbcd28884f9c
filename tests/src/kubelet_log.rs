//! What a real kubelet's log says went wrong with a DRA plugin's device-health stream
//! (`DRAResourceHealth/NodeWatchResources`). Kubelet 1.36 opens that stream on every DRA
//! plugin and logs each failure (every 5 s while it fails): a plugin without the
//! service shows as "Error receiving from WatchResources stream ... code =
//! Unimplemented". The suite's fake nodes check their kubelet's log with this before
//! they stop (`suite/kubelet.rs`, `FakeNodes`).

/// What marks a kubelet log line as about the health stream.
const ABOUT_HEALTH: [&str; 4] = [
    "WatchResources",
    "DRAResourceHealth",
    "health stream",
    "health info cache",
];

/// The gRPC codes of a plugin that is gone, not wrong: the suite kills daemons and
/// nodes on purpose, and the kubelet cancels the stream of a plugin it deregisters.
const PLUGIN_GONE: [&str; 2] = ["code = Unavailable", "code = Canceled"];

/// The lines of `log` (klog's text format) that report an error of the health stream,
/// other than the plugin being gone.
pub fn health_stream_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| ABOUT_HEALTH.iter().any(|marker| line.contains(marker)))
        .filter(|line| is_error(line))
        .filter(|line| !PLUGIN_GONE.iter().any(|code| line.contains(code)))
        .collect()
}

/// An error-level line (`E1129 04:55:12.123456 ...`), or any line carrying an error
/// value (`err="..."`, `error="..."`: the kubelet logs a stream's end at info, with
/// its error).
fn is_error(line: &str) -> bool {
    let mut chars = line.chars();
    let error_level =
        matches!(chars.next(), Some('E' | 'F')) && chars.next().is_some_and(|c| c.is_ascii_digit());
    error_level || line.contains(" err=\"") || line.contains(" error=\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_a_plugin_without_the_service_causes() {
        let log = concat!(
            "I1129 05:01:02.000001    4242 kubelet.go:1] \"Started kubelet\"\n",
            "E1129 05:01:03.000002    4242 manager.go:900] \"Error receiving from WatchResources stream\" err=\"rpc error: code = Unimplemented desc = \" pluginName=\"compute-domain.nvidia.com\"\n",
            "I1129 05:01:03.000003    4242 dra_plugin_manager.go:300] \"WatchResources health stream has ended\" error=\"rpc error: code = Unimplemented desc = \"\n",
            "E1129 05:01:04.000004    4242 manager.go:200] \"Failed to update health info cache\" err=\"disk full\"\n",
        );
        let found = health_stream_errors(log);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].contains("Unimplemented"));
        assert!(found[2].contains("health info cache"));
    }

    #[test]
    fn passes_a_healthy_stream_and_a_plugin_that_is_gone() {
        let log = concat!(
            "I1129 05:01:02.000001    4242 dra_plugin_manager.go:290] \"Successfully started WatchResources health stream\"\n",
            "I1129 05:01:02.000002    4242 dra_plugin_manager.go:300] \"WatchResources health stream has ended\" error=null\n",
            "E1129 05:01:03.000003    4242 manager.go:900] \"Error receiving from WatchResources stream\" err=\"rpc error: code = Unavailable desc = error reading from server: EOF\"\n",
            "E1129 05:01:08.000004    4242 dra_plugin.go:120] \"NodeWatchResources RPC call failed\" err=\"rpc error: code = Unavailable desc = connection error\"\n",
            "E1129 05:01:09.000005    4242 manager.go:900] \"Error receiving from WatchResources stream\" err=\"rpc error: code = Canceled desc = context canceled\"\n",
            "E1129 05:01:10.000006    4242 kubelet.go:2] \"Error syncing pod\" err=\"unrelated\"\n",
        );
        assert_eq!(health_stream_errors(log), Vec::<&str>::new());
    }
}
