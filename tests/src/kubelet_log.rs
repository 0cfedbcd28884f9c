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

    // Lines as kubelet 1.36.2 of ../shared/kube wrote them (/work/evidence/health/).

    #[test]
    fn finds_what_a_plugin_without_the_service_causes() {
        let log = concat!(
            "I1129 05:11:49.905231   23161 dra_plugin_manager.go:402] \"Successfully started WatchResources health stream\" logger=\"DRA registration handler\"\n",
            "E1129 05:11:49.929147   23161 manager.go:1038] \"Error receiving from WatchResources stream\" err=\"rpc error: code = Unimplemented desc = \" logger=\"DRA registration handler.dra-manager\" pluginName=\"compute-domain.nvidia.com\"\n",
            "I1129 05:11:49.929548   23161 dra_plugin_manager.go:405] \"WatchResources health stream has ended\" logger=\"DRA registration handler\" error=\"rpc error: code = Unimplemented desc = \"\n",
            "E1129 05:12:04.000004    4242 manager.go:200] \"Failed to update health info cache\" err=\"disk full\" pluginName=\"compute-domain.nvidia.com\"\n",
        );
        let found = health_stream_errors(log);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].contains("Unimplemented"));
        assert!(found[1].starts_with("I1129"));
        assert!(found[2].contains("health info cache"));
    }

    #[test]
    fn passes_a_healthy_stream_and_a_plugin_that_is_gone() {
        let log = concat!(
            "I1129 05:20:33.388793    7306 dra_plugin_manager.go:402] \"Successfully started WatchResources health stream\" logger=\"DRA registration handler\"\n",
            // SIGKILLed daemon.
            "E1129 05:20:35.299087    7306 manager.go:1038] \"Error receiving from WatchResources stream\" err=\"rpc error: code = Unavailable desc = error reading from server: EOF\" logger=\"DRA registration handler.dra-manager\" pluginName=\"compute-domain.nvidia.com\"\n",
            "I1129 05:20:35.299837    7306 dra_plugin_manager.go:405] \"WatchResources health stream has ended\" logger=\"DRA registration handler\" error=\"rpc error: code = Unavailable desc = error reading from server: EOF\"\n",
            // Its successor registered: the kubelet drops the old plugin's stream.
            "E1129 05:20:41.352226    7306 manager.go:1038] \"Error receiving from WatchResources stream\" err=\"rpc error: code = Canceled desc = context canceled\" logger=\"DRA registration handler.dra-manager\" pluginName=\"compute-domain.nvidia.com\"\n",
            // A daemon stopping: the stream ends cleanly.
            "I1129 05:21:00.622149    7306 dra_plugin_manager.go:405] \"WatchResources health stream has ended\" logger=\"DRA registration handler\" error=null\n",
            "E1129 05:21:01.000000    7306 kubelet.go:2] \"Error syncing pod\" err=\"unrelated\"\n",
        );
        assert_eq!(health_stream_errors(log), Vec::<&str>::new());
    }
}
