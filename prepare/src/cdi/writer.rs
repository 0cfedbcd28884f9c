//! One CDI spec file per prepared claim, in the directory the container runtime reads.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use domaind_actors::model::AllocationMode;

use super::CdiError;
use super::names::{ClaimUid, Kind};
use super::spec::{CDI_VERSION, ContainerEdits, Device, DeviceNode, Spec};
use domaind_atomic_file::{self as atomic, Durability};

/// A claim's spec is not flushed to disk: it means nothing after a reboot (the pods
/// are gone, the checkpoint of the previous boot is discarded, and the kubelet prepares
/// again), a crash of domaind alone leaves it in the page cache, and `/var/run/cdi`
/// is a tmpfs on most hosts anyway. Two fsyncs per prepare were most of its cost.
const SPEC_DURABILITY: Durability = Durability::ProcessCrash;

/// Where container runtimes look for CDI specs that change at run time.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// Where the IMEX channel device nodes live, on the host and in containers.
pub const CHANNEL_DEVICE_DIR: &str = "/dev/nvidia-caps-imex-channels";

/// Readable by the runtime, whatever user it runs as.
const SPEC_MODE: u32 = 0o644;

/// The container path of IMEX channel `channel`.
pub fn channel_device_path(channel: u32) -> String {
    format!("{CHANNEL_DEVICE_DIR}/channel{channel}")
}

/// Which IMEX channels a claim's containers get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimChannels {
    /// The domain's channel.
    Single(u32),
    /// Every channel listed.
    All(Vec<u32>),
}

impl ClaimChannels {
    /// The channels `mode` gives: the domain's channel, or every one of `all`.
    pub fn for_mode(
        mode: AllocationMode,
        domain_channel: u32,
        all: impl IntoIterator<Item = u32>,
    ) -> Self {
        match mode {
            AllocationMode::Single => Self::Single(domain_channel),
            AllocationMode::All => Self::All(all.into_iter().collect()),
        }
    }

    pub fn mode(&self) -> AllocationMode {
        match self {
            Self::Single(_) => AllocationMode::Single,
            Self::All(_) => AllocationMode::All,
        }
    }
}

/// Writes, removes and lists claims' CDI specs.
#[derive(Debug, Clone)]
pub struct CdiWriter {
    dir: PathBuf,
    kind: Kind,
}

impl CdiWriter {
    /// Specs for the DRA driver `driver` (vendor `k8s.<driver>`) in `dir`, created at
    /// the first write if missing.
    pub fn new(dir: impl Into<PathBuf>, driver: &str) -> Result<Self, CdiError> {
        Ok(Self {
            dir: dir.into(),
            kind: Kind::for_driver(driver)?,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    pub fn spec_path(&self, claim: &ClaimUid) -> PathBuf {
        self.dir.join(self.kind.spec_file_name(claim))
    }

    /// The device name of a claim's channels: `<uid>-channel-<N>` for the domain's
    /// channel, `<uid>-all-channels` for all. One device per claim either way, so the
    /// claim's one allocated device maps to one CDI device id.
    pub fn device_name(claim: &ClaimUid, channels: &ClaimChannels) -> String {
        match channels {
            ClaimChannels::Single(channel) => format!("{claim}-channel-{channel}"),
            ClaimChannels::All(_) => format!("{claim}-all-channels"),
        }
    }

    /// The spec for `claim`: one device whose nodes are the channels', with the major
    /// number of `nvidia-caps-imex-channels` and the channel as minor.
    pub fn spec(
        &self,
        claim: &ClaimUid,
        major: u32,
        channels: &ClaimChannels,
    ) -> Result<Spec, CdiError> {
        let minors = match channels {
            ClaimChannels::Single(channel) => vec![*channel],
            ClaimChannels::All(all) => {
                let mut all = all.clone();
                all.sort_unstable();
                all.dedup();
                if all.is_empty() {
                    return Err(CdiError::NoChannels {
                        claim: claim.to_string(),
                    });
                }
                all
            }
        };
        let device_nodes = minors
            .into_iter()
            .map(|channel| DeviceNode::char_device(channel_device_path(channel), major, channel))
            .collect();
        let spec = Spec {
            cdi_version: CDI_VERSION.to_owned(),
            kind: self.kind.to_string(),
            devices: vec![Device {
                name: Self::device_name(claim, channels),
                container_edits: ContainerEdits { device_nodes },
            }],
            container_edits: None,
        };
        spec.check().map_err(|reason| CdiError::InvalidSpec {
            claim: claim.to_string(),
            reason,
        })?;
        Ok(spec)
    }

    /// Writes `claim`'s spec atomically and returns its fully qualified CDI device ids.
    /// Writing the same spec again leaves the file untouched, so that runtimes watching
    /// the directory see no change.
    pub fn write_claim(
        &self,
        claim: &ClaimUid,
        major: u32,
        channels: &ClaimChannels,
    ) -> Result<Vec<String>, CdiError> {
        let spec = self.spec(claim, major, channels)?;
        let path = self.spec_path(claim);
        let mut bytes = serde_json::to_vec_pretty(&spec).map_err(|source| CdiError::Encode {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        let ids = spec
            .devices
            .iter()
            .map(|device| self.kind.device_id(&device.name))
            .collect();
        if fs::read(&path).is_ok_and(|existing| existing == bytes) {
            return Ok(ids);
        }
        let write_error = |source| CdiError::Write {
            path: path.clone(),
            source,
        };
        atomic::replace_with(
            &self.dir,
            &self.kind.spec_file_name(claim),
            &bytes,
            SPEC_MODE,
            SPEC_DURABILITY,
        )
        .map_err(write_error)?;
        Ok(ids)
    }

    /// Removes `claim`'s spec. Returns whether there was one: a claim never written,
    /// or already removed, is not an error.
    pub fn remove_claim(&self, claim: &ClaimUid) -> Result<bool, CdiError> {
        atomic::remove_with(&self.dir, &self.kind.spec_file_name(claim), SPEC_DURABILITY).map_err(
            |source| CdiError::Remove {
                path: self.spec_path(claim),
                source,
            },
        )
    }

    /// The claims that have a spec here, sorted: for reconciling with the checkpoint
    /// after a restart. Other vendors' files and temporary files are ignored.
    pub fn list_claims(&self) -> Result<Vec<ClaimUid>, CdiError> {
        let list_error = |source| CdiError::List {
            dir: self.dir.clone(),
            source,
        };
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(list_error(error)),
        };
        let mut claims = Vec::new();
        for entry in entries {
            let entry = entry.map_err(list_error)?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if let Some(claim) = self.kind.claim_of_spec_file(&name)
                && entry.file_type().map_err(list_error)?.is_file()
            {
                claims.push(claim);
            }
        }
        claims.sort();
        Ok(claims)
    }

    /// Removes temporary files that our interrupted writes left, and returns their
    /// names. For start-up, before any claim is prepared: it would pull a file from
    /// under a write in flight.
    pub fn remove_stale_temp_files(&self) -> Result<Vec<String>, CdiError> {
        atomic::remove_stale_temps(&self.dir, |name| self.is_our_temp(name)).map_err(|source| {
            CdiError::List {
                dir: self.dir.clone(),
                source,
            }
        })
    }

    fn is_our_temp(&self, name: &str) -> bool {
        // `.<spec file name>.<random>.tmp`
        name.strip_prefix('.')
            .and_then(|rest| rest.rsplit_once('.'))
            .and_then(|(rest, _tmp)| rest.rsplit_once('.'))
            .and_then(|(spec_file, _random)| self.kind.claim_of_spec_file(spec_file))
            .is_some_and(|claim| atomic::is_temp_of(name, &self.kind.spec_file_name(&claim)))
    }
}
