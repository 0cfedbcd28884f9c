//! The runner's side: `domaind imex-runner --socket SOCKET`.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use nix::sys::signal::Signal;
use tokio::net::UnixListener;
use tokio::process::Command;
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::{Instance, RunnerSignal, SignalRequest, StartRequest, StopRequest, WaitRequest};
use crate::child::{Ask, Running, watch_child};
use crate::output::OutputTail;
use crate::spawner::Spawner;
use crate::{Command as ImexCommand, guard};

/// The hidden subcommand of `domaind` (and `imex-sim`) that runs the runner.
pub const RUNNER_SUBCOMMAND: &str = "imex-runner";

/// The longest a wait or a stop may ask for: a request is one connection, and the
/// client bounds its own side a little above it.
const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// How long an ended daemon's last output may take to arrive through the pipes.
const LAST_WORDS_WAIT: Duration = Duration::from_millis(200);

/// How long the daemons get to stop when the runner itself is stopped.
const SHUTDOWN_STOP: Duration = Duration::from_secs(5);

type Reply<T> = Result<Json<T>, (StatusCode, String)>;

struct Runner {
    instances: Mutex<BTreeMap<PathBuf, Kept>>,
    spawner: Spawner,
    /// Our own binary's `imex-guard`, so that the daemons die with the runner.
    guard: Option<ImexCommand>,
    /// Instance numbers: random high bits, so that a restarted runner never hands out
    /// a number an old instance had, and a counter below them.
    next_instance: AtomicU64,
}

struct Kept {
    instance: Instance,
    running: Running,
    output: OutputTail,
}

impl Kept {
    fn describe(&self) -> Instance {
        let mut instance = self.instance.clone();
        instance.ended = self.running.ended();
        instance.last_output = self.output.snapshot();
        instance
    }
}

/// Serves `socket` until `shutdown` completes, then stops every daemon it runs.
pub async fn serve(
    socket: &Path,
    guard: Option<ImexCommand>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = bind(socket).await?;
    let runner = Arc::new(Runner {
        instances: Mutex::default(),
        spawner: Spawner::new(),
        guard,
        next_instance: AtomicU64::new(u64::from(rand::random::<u32>()) << 32),
    });
    let app = Router::new()
        .route("/v1/instances", get(list))
        .route("/v1/start", post(start))
        .route("/v1/signal", post(signal))
        .route("/v1/stop", post(stop))
        .route("/v1/wait", post(wait))
        .with_state(runner.clone());
    info!(socket = %socket.display(), "IMEX runner serving");
    // The daemons are stopped before the server finishes: its starters' waits on them
    // are requests in flight, which a graceful shutdown waits for.
    let stopping = runner.clone();
    let stop_daemons = async move {
        shutdown.await;
        info!("IMEX runner stopping: stopping its daemons");
        stop_all(&stopping).await;
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(stop_daemons)
        .await
        .context("the runner's socket failed")?;
    let _ = std::fs::remove_file(socket);
    info!("IMEX runner stopped");
    Ok(())
}

async fn stop_all(runner: &Runner) {
    let running: Vec<(PathBuf, u64)> = runner
        .instances
        .lock()
        .await
        .iter()
        .filter(|(_, kept)| kept.running.ended().is_none())
        .map(|(config, kept)| (config.clone(), kept.instance.instance))
        .collect();
    for (config, instance) in running {
        let _ = stop_instance(runner, &config, instance, SHUTDOWN_STOP).await;
    }
}

/// Binds `socket` in a directory only root may enter; a socket left by a runner that
/// died is replaced, one that a live runner answers on is not.
async fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} root's alone", dir.display()))?;
    if socket.exists() {
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            bail!("another IMEX runner serves {}", socket.display());
        }
        std::fs::remove_file(socket)
            .with_context(|| format!("cannot remove the stale {}", socket.display()))?;
    }
    let listener = UnixListener::bind(socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", socket.display()))?;
    Ok(listener)
}

async fn list(State(runner): State<Arc<Runner>>) -> Json<Vec<Instance>> {
    let instances = runner.instances.lock().await;
    Json(instances.values().map(Kept::describe).collect())
}

async fn start(
    State(runner): State<Arc<Runner>>,
    Json(request): Json<StartRequest>,
) -> Reply<Instance> {
    let mut instances = runner.instances.lock().await;
    if let Some(kept) = instances.get(&request.config)
        && kept.running.ended().is_none()
    {
        return Err((
            StatusCode::CONFLICT,
            format!(
                "instance {} (pid {:?}) already runs on {}",
                kept.instance.instance,
                kept.instance.pid,
                request.config.display()
            ),
        ));
    }
    let mut child = runner
        .spawner
        .spawn(command(&request, runner.guard.as_ref()))
        .await
        .map_err(|e| {
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("cannot start {}: {e}", request.program.display()),
            )
        })?;
    let output = OutputTail::of(&mut child);
    let instance = Instance {
        config: request.config.clone(),
        instance: runner.next_instance.fetch_add(1, Ordering::Relaxed),
        pid: child.id(),
        program: request.program.clone(),
        served: request.served,
        ended: None,
        last_output: Vec::new(),
    };
    info!(instance = instance.instance, pid = instance.pid, config = %instance.config.display(), "IMEX daemon started");
    let kept = Kept {
        instance: instance.clone(),
        running: watch_child(child, Arc::default()),
        output,
    };
    instances.insert(request.config, kept);
    Ok(Json(instance))
}

/// The daemon's command line, through the guard so that it dies with the runner.
fn command(request: &StartRequest, guard_command: Option<&ImexCommand>) -> Command {
    guard::daemon_command(
        guard_command,
        &request.program,
        &request.args,
        &request.config,
        &request.env,
    )
}

fn unknown(config: &Path, instance: u64) -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        format!("no instance {instance} on {}", config.display()),
    )
}

async fn signal(
    State(runner): State<Arc<Runner>>,
    Json(request): Json<SignalRequest>,
) -> Reply<()> {
    let instances = runner.instances.lock().await;
    let Some(kept) = instances.get(&request.config).filter(|kept| {
        kept.instance.instance == request.instance && kept.running.ended().is_none()
    }) else {
        return Err(unknown(&request.config, request.instance));
    };
    match request.signal {
        RunnerSignal::Usr1 => kept.running.signal(Signal::SIGUSR1),
        RunnerSignal::Term => kept.running.signal(Signal::SIGTERM),
        RunnerSignal::Kill => {
            let _ = kept.running.asks.send(Ask::Kill);
        }
    }
    info!(instance = request.instance, signal = ?request.signal, "IMEX daemon signalled");
    Ok(Json(()))
}

async fn stop(
    State(runner): State<Arc<Runner>>,
    Json(request): Json<StopRequest>,
) -> Reply<Instance> {
    let limit = Duration::from_millis(request.timeout_ms).min(LONGEST_WAIT);
    stop_instance(&runner, &request.config, request.instance, limit)
        .await
        .map(Json)
}

/// SIGTERM, `limit`, then SIGKILL.
async fn stop_instance(
    runner: &Runner,
    config: &Path,
    instance: u64,
    limit: Duration,
) -> Result<Instance, (StatusCode, String)> {
    let mut ended = {
        let instances = runner.instances.lock().await;
        let Some(kept) = instances
            .get(config)
            .filter(|kept| kept.instance.instance == instance)
        else {
            return Err(unknown(config, instance));
        };
        kept.running.signal(Signal::SIGTERM);
        kept.running.watch_end()
    };
    let gone = matches!(
        tokio::time::timeout(limit, ended.wait_for(Option::is_some)).await,
        Ok(Ok(_))
    );
    if !gone {
        warn!(instance, timeout = ?limit, "IMEX daemon ignored SIGTERM; killing it");
        if let Some(kept) = runner.instances.lock().await.get(config) {
            let _ = kept.running.asks.send(Ask::Kill);
        }
        let _ = tokio::time::timeout(limit, ended.wait_for(Option::is_some)).await;
    }
    describe(runner, config, instance).await
}

/// The instance as it is now; once ended, with the last words its pipes still held.
async fn describe(
    runner: &Runner,
    config: &Path,
    instance: u64,
) -> Result<Instance, (StatusCode, String)> {
    let instances = runner.instances.lock().await;
    let kept = instances
        .get(config)
        .filter(|kept| kept.instance.instance == instance)
        .ok_or_else(|| unknown(config, instance))?;
    let mut described = kept.describe();
    if described.ended.is_some() {
        described.last_output = kept.output.settled_snapshot(LAST_WORDS_WAIT).await;
    }
    Ok(described)
}

async fn wait(
    State(runner): State<Arc<Runner>>,
    Json(request): Json<WaitRequest>,
) -> Reply<Instance> {
    let mut ended = {
        let instances = runner.instances.lock().await;
        let Some(kept) = instances
            .get(&request.config)
            .filter(|kept| kept.instance.instance == request.instance)
        else {
            return Err(unknown(&request.config, request.instance));
        };
        kept.running.watch_end()
    };
    let limit = Duration::from_millis(request.timeout_ms).min(LONGEST_WAIT);
    let _ = tokio::time::timeout(limit, ended.wait_for(Option::is_some)).await;
    describe(&runner, &request.config, request.instance)
        .await
        .map(Json)
}
