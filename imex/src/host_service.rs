//! IMEX run by the host's systemd: NVIDIA's IMEX package installs `nvidia-imex.service`,
//! and in host mode (`domaind run --imex-host-service UNIT`) the adapter writes IMEX's
//! config and drives the unit through `systemctl` instead of running IMEX itself or
//! through the runner. Systemd keeps IMEX through every restart of domaind's container.
//!
//! - The unit must run IMEX in the foreground on the config we write: our config says
//!   `DAEMONIZE=0`, so `Type=simple` or `exec`, and `ExecStart=... -c <config dir>/
//!   config.cfg`. NVIDIA's unit does neither (`Type=forking` on
//!   `/etc/nvidia-imex/config.cfg`), so a drop-in sets both (docs/OPERATIONS.md). A
//!   unit that does not is refused with what to change, never started.
//! - `start` is `systemctl start`, after which what the daemon serves and its main pid
//!   are recorded in [`RECORD_FILE`] beside the config: a restarted adapter adopts a
//!   running unit whose main pid and record match. A unit running without such a
//!   record (started at boot, by hand, or by systemd's own `Restart=`) serves a config
//!   nobody can vouch for: it is treated as serving another one, kept while prepared
//!   claims use it, else restarted.
//! - An instance is the unit's main pid: systemd offers nothing else a restarted
//!   adapter could compare with what it recorded.
//! - Reloads are `systemctl kill --kill-whom=main --signal=SIGUSR1`. An exit is seen by
//!   asking `systemctl show` every [`POLL`]: the main pid gone or another; how it
//!   ended comes from `ExecMainCode` and `ExecMainStatus`. Systemd tells nothing
//!   sooner that a pod could wait on, and IMEX's own checks are seconds apart anyway.
//! - One IMEX per node: the unit runs on one config, and a start on another is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, timeout};
use tracing::{info, warn};

use super::config::{Command, HostUnit};
use super::keeper::{ImexKeeper, KeeperError};
use super::runner::{Instance, RunnerSignal, StartRequest};

/// What domaind started the unit with, beside IMEX's config: JSON [`Record`].
pub const RECORD_FILE: &str = "host-service.json";
/// How often a running unit is asked whether its main process still runs.
pub const POLL: Duration = Duration::from_secs(1);
/// How long one `systemctl` call other than a stop may take: `start` of a
/// `Type=simple` unit returns once the process is forked.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Added to a stop's own bound for `systemctl` around it.
const STOP_MARGIN: Duration = Duration::from_secs(5);
/// The properties `show` asks for.
const PROPERTIES: &str = "LoadState,ActiveState,MainPID,ExecStart,Type,ExecMainCode,ExecMainStatus";

/// What was started, recorded at each start: how a restarted adapter tells whether
/// the unit's main process serves the config it would write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    unit: String,
    main_pid: u32,
    served: String,
}

/// The unit, as `systemctl show` describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitState {
    /// `loaded`, or `not-found` when no such unit is installed.
    pub load_state: String,
    pub active_state: String,
    /// The main process, while there is one (`MainPID=0` is none).
    pub main_pid: Option<u32>,
    /// The first `ExecStart`'s command line.
    pub exec_start: Vec<String>,
    pub unit_type: String,
    /// How the last main process ended: `CLD_EXITED` (1), `CLD_KILLED` (2) or
    /// `CLD_DUMPED` (3), with its exit status or signal number.
    pub exec_main_code: i32,
    pub exec_main_status: i32,
}

impl UnitState {
    /// Parses `KEY=VALUE` lines; keys not asked for are ignored.
    pub fn parse(text: &str) -> Self {
        let values: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .collect();
        let get = |key: &str| values.get(key).copied().unwrap_or_default();
        Self {
            load_state: get("LoadState").to_owned(),
            active_state: get("ActiveState").to_owned(),
            main_pid: get("MainPID").parse().ok().filter(|pid| *pid != 0),
            exec_start: exec_start_argv(get("ExecStart")),
            unit_type: get("Type").to_owned(),
            exec_main_code: get("ExecMainCode").parse().unwrap_or_default(),
            exec_main_status: get("ExecMainStatus").parse().unwrap_or_default(),
        }
    }

    /// The config `ExecStart` names with `-c`.
    pub fn config(&self) -> Option<PathBuf> {
        let at = self.exec_start.iter().position(|arg| arg == "-c")?;
        self.exec_start.get(at + 1).map(PathBuf::from)
    }

    /// How the last main process ended, as Rust's exit statuses read.
    pub fn ended(&self) -> String {
        let signal = |n: i32| {
            nix::sys::signal::Signal::try_from(n)
                .map(|s| format!("signal: {n} ({s})"))
                .unwrap_or_else(|_| format!("signal: {n}"))
        };
        let how = match self.exec_main_code {
            1 => format!("exit status: {}", self.exec_main_status),
            2 => signal(self.exec_main_status),
            3 => format!("{} (core dumped)", signal(self.exec_main_status)),
            _ => "no exit recorded".to_owned(),
        };
        format!("{how}; unit {}", self.active_state)
    }
}

/// The command line of `ExecStart`'s first entry: `{ path=P ; argv[]=A B C ; ... }`.
/// (Arguments with spaces, which systemd quotes, are not expected on IMEX's line.)
fn exec_start_argv(value: &str) -> Vec<String> {
    let Some((_, rest)) = value.split_once("argv[]=") else {
        return Vec::new();
    };
    let argv = rest.split(" ;").next().unwrap_or_default();
    argv.split_whitespace().map(str::to_owned).collect()
}

/// Polls `probe` every `period` until it finds something, for at most about `limit`
/// (the last probe is no later than `limit` after the first).
pub(crate) async fn poll_until<T, F, Fut>(
    mut probe: F,
    period: Duration,
    limit: Duration,
) -> Result<Option<T>, KeeperError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, KeeperError>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = probe().await? {
            return Ok(Some(found));
        }
        let next = Instant::now() + period;
        if next > deadline {
            return Ok(None);
        }
        tokio::time::sleep_until(next).await;
    }
}

/// The host's IMEX unit, driven through `systemctl`.
#[derive(Debug, Clone)]
pub struct HostService {
    unit: String,
    systemctl: Command,
    /// The one config IMEX runs on, which the unit's `ExecStart` must name.
    config: PathBuf,
}

impl HostService {
    pub fn new(unit: HostUnit, config: PathBuf) -> Self {
        Self {
            unit: unit.unit,
            systemctl: unit.systemctl,
            config,
        }
    }

    fn record_path(&self) -> PathBuf {
        self.config.with_file_name(RECORD_FILE)
    }

    fn command_line(&self, args: &[&str]) -> String {
        std::iter::once(self.systemctl.program.display().to_string())
            .chain(self.systemctl.args.iter().cloned())
            .chain(args.iter().map(|a| (*a).to_owned()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    async fn systemctl(&self, args: &[&str], limit: Duration) -> Result<String, KeeperError> {
        let shown = self.command_line(args);
        let output = tokio::process::Command::new(&self.systemctl.program)
            .args(&self.systemctl.args)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = timeout(limit, output)
            .await
            .map_err(|_| KeeperError::Failed(format!("`{shown}` did not end within {limit:?}")))?
            .map_err(|e| KeeperError::Failed(format!("cannot run `{shown}`: {e}")))?;
        if !output.status.success() {
            return Err(KeeperError::Failed(format!(
                "`{shown}` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    pub async fn show(&self) -> Result<UnitState, KeeperError> {
        let text = self
            .systemctl(&["show", &self.unit, "-p", PROPERTIES], COMMAND_TIMEOUT)
            .await?;
        Ok(UnitState::parse(&text))
    }

    /// Refuses a unit that cannot run the IMEX we configure, saying what to change.
    fn check(&self, state: &UnitState) -> Result<(), KeeperError> {
        let unit = &self.unit;
        let dropin =
            "a drop-in (systemctl edit) sets them, see docs/OPERATIONS.md, \"Host-managed IMEX\"";
        if state.load_state != "loaded" {
            return Err(KeeperError::Misconfigured(format!(
                "systemd unit {unit} is not loaded (LoadState={}): is NVIDIA's IMEX package installed on the host?",
                state.load_state
            )));
        }
        if !matches!(state.unit_type.as_str(), "simple" | "exec") {
            return Err(KeeperError::Misconfigured(format!(
                "systemd unit {unit} has Type={}, but the config domaind writes runs IMEX in the \
                 foreground (DAEMONIZE=0), which needs Type=simple or Type=exec; {dropin}",
                state.unit_type
            )));
        }
        if state.config().as_deref() != Some(self.config.as_path()) {
            return Err(KeeperError::Misconfigured(format!(
                "systemd unit {unit} runs `{}`, not IMEX on the config domaind writes: its \
                 ExecStart must end in `-c {}`; {dropin}",
                state.exec_start.join(" "),
                self.config.display()
            )));
        }
        Ok(())
    }

    fn read_record(&self) -> Option<Record> {
        let path = self.record_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                warn!(file = %path.display(), %error, "cannot read what the IMEX unit was started with");
                return None;
            }
        };
        serde_json::from_str(&text)
            .inspect_err(|error| warn!(file = %path.display(), %error, "what the IMEX unit was started with does not parse"))
            .ok()
    }

    fn write_record(&self, record: &Record) -> std::io::Result<()> {
        let path = self.record_path();
        let dir = path.parent().unwrap_or(Path::new("."));
        let json = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
        domaind_atomic_file::replace(dir, RECORD_FILE, &json, 0o644)
    }

    fn instance(&self, state: &UnitState, instance: u64, served: String) -> Instance {
        Instance {
            config: state.config().unwrap_or_default(),
            instance,
            pid: u32::try_from(instance).ok(),
            program: state
                .exec_start
                .first()
                .map(PathBuf::from)
                .unwrap_or_default(),
            served,
            ended: None,
            last_output: Vec::new(),
        }
    }

    /// `instance` as it ended, told by `state` (the unit after its end).
    fn ended(&self, state: &UnitState, instance: u64) -> Instance {
        let how = match state.main_pid {
            Some(other) => format!(
                "replaced outside domaind: the unit's main process is pid {other} now; unit {}",
                state.active_state
            ),
            None => state.ended(),
        };
        Instance {
            config: self.config.clone(),
            ended: Some(format!(
                "{how}; its output is in the journal (journalctl -u {})",
                self.unit
            )),
            ..self.instance(state, instance, String::new())
        }
    }

    /// Whether `state`'s main process is `instance`.
    fn runs(state: &UnitState, instance: u64) -> bool {
        state.main_pid.map(u64::from) == Some(instance)
    }

    /// Polls until `instance` has ended: the unit after, or `None` after `limit`.
    async fn until_ended(
        &self,
        instance: u64,
        limit: Duration,
    ) -> Result<Option<UnitState>, KeeperError> {
        poll_until(
            || async {
                let state = self.show().await?;
                Ok((!Self::runs(&state, instance)).then_some(state))
            },
            POLL,
            limit,
        )
        .await
    }
}

fn signal_name(signal: RunnerSignal) -> &'static str {
    match signal {
        RunnerSignal::Usr1 => "SIGUSR1",
        RunnerSignal::Term => "SIGTERM",
        RunnerSignal::Kill => "SIGKILL",
    }
}

#[async_trait]
impl ImexKeeper for HostService {
    fn describe(&self) -> String {
        format!(
            "systemd unit {} (through `{}`)",
            self.unit,
            self.command_line(&[])
        )
    }

    async fn instances(&self) -> Result<Vec<Instance>, KeeperError> {
        let state = self.show().await?;
        let Some(pid) = state.main_pid else {
            return Ok(Vec::new());
        };
        // What it serves is known only for the process we started and recorded.
        let served = self
            .read_record()
            .filter(|r| r.unit == self.unit && r.main_pid == pid)
            .map(|r| r.served)
            .unwrap_or_default();
        Ok(vec![self.instance(&state, u64::from(pid), served)])
    }

    async fn start(&self, request: &StartRequest) -> Result<Instance, KeeperError> {
        if request.config != self.config {
            return Err(KeeperError::Misconfigured(format!(
                "host-managed IMEX runs one daemon per node, on {} (the config systemd unit {} \
                 runs); asked for one on {}",
                self.config.display(),
                self.unit,
                request.config.display()
            )));
        }
        let state = self.show().await?;
        self.check(&state)?;
        if let Some(pid) = state.main_pid {
            return Err(KeeperError::Failed(format!(
                "systemd unit {} already runs IMEX (pid {pid})",
                self.unit
            )));
        }
        self.systemctl(&["start", &self.unit], COMMAND_TIMEOUT)
            .await?;
        let state = self.show().await?;
        let Some(pid) = state.main_pid else {
            return Err(KeeperError::Failed(format!(
                "systemd unit {} started, but its main process has ended already ({}); its \
                 output is in the journal (journalctl -u {})",
                self.unit,
                state.ended(),
                self.unit
            )));
        };
        let record = Record {
            unit: self.unit.clone(),
            main_pid: pid,
            served: request.served.clone(),
        };
        // IMEX runs: a record not written costs only the next adapter's adoption (it
        // will keep or restart the daemon), so it is no reason to fail the start.
        if let Err(error) = self.write_record(&record) {
            warn!(file = %self.record_path().display(), %error, "cannot record what the IMEX unit was started with: a restarted domaind will not adopt it");
        }
        info!(unit = %self.unit, pid, "IMEX started through its systemd unit");
        Ok(self.instance(&state, u64::from(pid), request.served.clone()))
    }

    async fn signal(
        &self,
        _config: &Path,
        instance: u64,
        signal: RunnerSignal,
    ) -> Result<(), KeeperError> {
        let state = self.show().await?;
        if !Self::runs(&state, instance) {
            return Err(KeeperError::Gone(format!(
                "systemd unit {}'s main process is not pid {instance} any more ({:?})",
                self.unit, state.main_pid
            )));
        }
        let signal = format!("--signal={}", signal_name(signal));
        self.systemctl(
            &["kill", "--kill-whom=main", &signal, &self.unit],
            COMMAND_TIMEOUT,
        )
        .await
        .map(drop)
    }

    async fn stop(
        &self,
        _config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, KeeperError> {
        let state = self.show().await?;
        if !Self::runs(&state, instance) {
            return Ok(self.ended(&state, instance));
        }
        // Systemd sends SIGTERM, waits its own TimeoutStopSec, then SIGKILL; past our
        // bound we send the SIGKILL ourselves.
        if let Err(error) = self
            .systemctl(&["stop", &self.unit], limit + STOP_MARGIN)
            .await
        {
            warn!(%error, unit = %self.unit, "IMEX's unit did not stop: killing its main process");
            self.systemctl(
                &["kill", "--kill-whom=main", "--signal=SIGKILL", &self.unit],
                COMMAND_TIMEOUT,
            )
            .await?;
        }
        match self.until_ended(instance, limit).await? {
            Some(state) => Ok(self.ended(&state, instance)),
            None => Err(KeeperError::Failed(format!(
                "systemd unit {}'s main process {instance} outlived a stop and SIGKILL",
                self.unit
            ))),
        }
    }

    async fn wait(
        &self,
        _config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, KeeperError> {
        match self.until_ended(instance, limit).await? {
            Some(state) => Ok(self.ended(&state, instance)),
            None => Ok(Instance {
                config: self.config.clone(),
                ..self.instance(&UnitState::default(), instance, String::new())
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const NVIDIA_UNIT: &str = "LoadState=loaded\nActiveState=active\nMainPID=4242\n\
        ExecStart={ path=/usr/bin/nvidia-imex ; argv[]=/usr/bin/nvidia-imex -c /var/lib/domaind/imex/config.cfg ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n\
        Type=simple\nExecMainCode=0\nExecMainStatus=0\n";

    fn service() -> HostService {
        HostService::new(
            HostUnit {
                unit: "nvidia-imex.service".into(),
                systemctl: Command::new("systemctl"),
            },
            PathBuf::from("/var/lib/domaind/imex/config.cfg"),
        )
    }

    #[test]
    fn show_output_parses_into_the_unit_state() {
        let state = UnitState::parse(NVIDIA_UNIT);
        assert_eq!(state.load_state, "loaded");
        assert_eq!(state.main_pid, Some(4242));
        assert_eq!(state.exec_start[0], "/usr/bin/nvidia-imex");
        assert_eq!(
            state.config(),
            Some(PathBuf::from("/var/lib/domaind/imex/config.cfg"))
        );
    }

    #[test]
    fn a_unit_that_cannot_run_our_imex_is_refused_with_what_to_change() {
        let ok = UnitState::parse(NVIDIA_UNIT);
        assert!(service().check(&ok).is_ok());

        let stock = UnitState::parse(&NVIDIA_UNIT.replace(
            "/var/lib/domaind/imex/config.cfg",
            "/etc/nvidia-imex/config.cfg",
        ));
        let why = service().check(&stock).unwrap_err().to_string();
        assert!(why.contains("-c /var/lib/domaind/imex/config.cfg"), "{why}");
        assert!(why.contains("/etc/nvidia-imex/config.cfg"), "{why}");

        let forking = UnitState::parse(&NVIDIA_UNIT.replace("Type=simple", "Type=forking"));
        let why = service().check(&forking).unwrap_err().to_string();
        assert!(
            why.contains("Type=forking") && why.contains("DAEMONIZE=0"),
            "{why}"
        );

        let missing = UnitState::parse("LoadState=not-found\nActiveState=inactive\nMainPID=0\n");
        let why = service().check(&missing).unwrap_err().to_string();
        assert!(
            why.contains("not-found") && why.contains("installed"),
            "{why}"
        );
        assert_eq!(missing.main_pid, None);
    }

    #[test]
    fn an_end_reads_as_rusts_exit_statuses_do() {
        let killed =
            UnitState::parse("ActiveState=failed\nMainPID=0\nExecMainCode=2\nExecMainStatus=9\n");
        assert_eq!(killed.ended(), "signal: 9 (SIGKILL); unit failed");
        let exited =
            UnitState::parse("ActiveState=failed\nMainPID=0\nExecMainCode=1\nExecMainStatus=3\n");
        assert_eq!(exited.ended(), "exit status: 3; unit failed");
        let dumped = UnitState::parse("ActiveState=failed\nExecMainCode=3\nExecMainStatus=6\n");
        assert_eq!(
            dumped.ended(),
            "signal: 6 (SIGABRT) (core dumped); unit failed"
        );
        let replaced = service().ended(&UnitState::parse(NVIDIA_UNIT), 17);
        let why = replaced.ended.unwrap();
        assert!(why.contains("pid 4242 now"), "{why}");
        assert!(why.contains("journalctl -u nvidia-imex.service"), "{why}");
    }

    /// Exits are polled every [`POLL`]: found at the first probe that sees one, and a
    /// wait with none ends after its limit, the probes no closer than the period.
    #[tokio::test(start_paused = true)]
    async fn polling_finds_an_end_at_the_next_probe_and_gives_up_at_the_limit() {
        let probes = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let counted = probes.clone();
        let found = poll_until(
            || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move { Ok((n == 3).then_some(n)) }
            },
            POLL,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        assert_eq!(found, Some(3));
        assert_eq!(start.elapsed(), POLL * 2, "the third probe, two periods in");

        probes.store(0, Ordering::SeqCst);
        let start = Instant::now();
        let counted = probes.clone();
        let none: Option<()> = poll_until(
            || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok(None) }
            },
            POLL,
            Duration::from_millis(3500),
        )
        .await
        .unwrap();
        assert_eq!(none, None);
        assert_eq!(probes.load(Ordering::SeqCst), 4, "at 0, 1, 2 and 3 s");
        assert_eq!(start.elapsed(), POLL * 3);

        // A probe that fails is an answer too: the caller retries.
        let failed: Result<Option<()>, _> = poll_until(
            || async { Err(KeeperError::Failed("systemctl: no answer".into())) },
            POLL,
            Duration::from_secs(5),
        )
        .await;
        assert!(!failed.unwrap_err().is_gone());
    }
}
