//! IMEX channel device nodes: `/dev/nvidia-caps-imex-channels/channelN`.
//!
//! The NVIDIA driver registers the character device `nvidia-caps-imex-channels` (its
//! major is in `/proc/devices`) but makes no nodes for it unless told to: a process
//! reaches channel N through a node with that major and minor N, so domaind makes the
//! nodes its claims hand out. Nodes are made with mode 0666, as NVIDIA's own DRA driver
//! makes them: who may use a channel is decided by which containers get the node
//! (through CDI), not by file permissions, and a container's user is rarely root.

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag, major, makedev, minor, mknod};

/// The driver's name for IMEX channels among the character devices.
pub const IMEX_CHANNELS_DEVICE: &str = "nvidia-caps-imex-channels";
/// The mode of the nodes domaind makes (see the module's documentation).
pub const CHANNEL_MODE: u32 = 0o666;
/// The largest major and minor Linux encodes (12 and 20 bits).
const MAX_MAJOR: u32 = (1 << 12) - 1;
const MAX_MINOR: u32 = (1 << 20) - 1;
const CHANNEL_DIR: &str = "nvidia-caps-imex-channels";
const CONTAINER_DEV: &str = "/dev";

/// Why a channel node cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} has no \"Character devices:\" section: is it the kernel's /proc/devices?",
        path.display()
    )]
    NoCharacterDevices { path: PathBuf },
    #[error("{}, line {line}: {problem} in {text:?}", path.display())]
    Malformed {
        path: PathBuf,
        line: usize,
        text: String,
        problem: &'static str,
    },
    #[error(
        "{name} is not among the character devices in {}: the NVIDIA driver is not loaded, or \
         has no IMEX channels; load it (`modprobe nvidia`) and start domaind again",
        path.display()
    )]
    MajorNotFound { path: PathBuf, name: String },
    #[error("{name} has two majors in {}: {first} and {second}", path.display())]
    AmbiguousMajor {
        path: PathBuf,
        name: String,
        first: u32,
        second: u32,
    },
    #[error("IMEX channel {channel} is out of range: a device minor is at most {MAX_MINOR}")]
    ChannelOutOfRange { channel: u32 },
    #[error("cannot create the directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot inspect {}: {source}", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is {found}, but IMEX channel {minor} needs a character device {major}:{minor} \
         ({IMEX_CHANNELS_DEVICE} has major {major} in /proc/devices): remove it, and domaind \
         makes the right one",
        path.display()
    )]
    WrongNode {
        path: PathBuf,
        found: String,
        major: u32,
        minor: u32,
    },
    #[error(
        "creating the character device {} needs CAP_MKNOD, which domaind lacks: run domaind \
         privileged (or with CAP_MKNOD)",
        path.display()
    )]
    MknodNotPermitted { path: PathBuf },
    #[error("cannot create the character device {}: {source}", path.display())]
    Mknod {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot set mode {CHANNEL_MODE:o} on {}: {source}", path.display())]
    SetMode {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where the kernel's files are: the host's, or a test's stand-ins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRoots {
    /// The file listing device majors; `/proc/devices` on a host.
    pub proc_devices: PathBuf,
    /// The directory device nodes go in; `/dev` on a host, or the host's /dev mounted
    /// elsewhere in domaind's container.
    pub dev: PathBuf,
}

impl Default for DeviceRoots {
    fn default() -> Self {
        Self {
            proc_devices: "/proc/devices".into(),
            dev: "/dev".into(),
        }
    }
}

impl DeviceRoots {
    /// The directory of channel nodes under [`DeviceRoots::dev`].
    pub fn channel_dir(&self) -> PathBuf {
        self.dev.join(CHANNEL_DIR)
    }

    /// Where domaind makes the node of `channel`.
    pub fn channel_path(&self, channel: u32) -> PathBuf {
        self.channel_dir().join(format!("channel{channel}"))
    }

    /// The major of [`IMEX_CHANNELS_DEVICE`], from [`DeviceRoots::proc_devices`].
    pub fn imex_channels_major(&self) -> Result<u32, DeviceError> {
        let text = fs::read_to_string(&self.proc_devices).map_err(|source| DeviceError::Read {
            path: self.proc_devices.clone(),
            source,
        })?;
        char_device_major(&text, IMEX_CHANNELS_DEVICE, &self.proc_devices)
    }
}

/// The path of `channel`'s node inside a container, whatever the host's /dev root.
pub fn container_channel_path(channel: u32) -> String {
    format!("{CONTAINER_DEV}/{CHANNEL_DIR}/channel{channel}")
}

/// The major of character device `name` in `text`, the content of `/proc/devices`
/// (`origin` names it in errors). Only the "Character devices:" section counts: block
/// devices have majors of their own.
pub fn char_device_major(text: &str, name: &str, origin: &Path) -> Result<u32, DeviceError> {
    let mut in_section = false;
    let mut seen_section = false;
    let mut found: Option<u32> = None;
    for (number, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if line.ends_with(':') && !line.starts_with(|c: char| c.is_ascii_digit()) {
            in_section = line == "Character devices:";
            seen_section |= in_section;
            continue;
        }
        if !in_section {
            continue;
        }
        let malformed = |problem| DeviceError::Malformed {
            path: origin.to_owned(),
            line: number + 1,
            text: raw.to_owned(),
            problem,
        };
        let (major, device) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| malformed("expected a major and a name"))?;
        let major: u32 = major
            .parse()
            .map_err(|_| malformed("the major is not a number"))?;
        if major > MAX_MAJOR {
            return Err(malformed("the major is larger than Linux allows"));
        }
        if device.trim() != name {
            continue;
        }
        match found {
            Some(first) if first != major => {
                return Err(DeviceError::AmbiguousMajor {
                    path: origin.to_owned(),
                    name: name.to_owned(),
                    first,
                    second: major,
                });
            }
            _ => found = Some(major),
        }
    }
    if !seen_section {
        return Err(DeviceError::NoCharacterDevices {
            path: origin.to_owned(),
        });
    }
    found.ok_or_else(|| DeviceError::MajorNotFound {
        path: origin.to_owned(),
        name: name.to_owned(),
    })
}

/// A channel's device node, as a CDI spec describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelNode {
    pub channel: u32,
    /// Where the node is on this machine.
    pub host_path: PathBuf,
    /// Where a container sees it: [`container_channel_path`].
    pub container_path: String,
    pub major: u32,
    pub minor: u32,
}

/// What [`ChannelDevices::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    Created,
    /// A correct node was there (made by us earlier, the driver or an admin) and was
    /// left alone, mode included.
    AlreadyThere,
}

/// Makes channel nodes under one set of roots, with the major read once at the start
/// (it changes only when the driver is reloaded, and domaind restarts with it).
#[derive(Debug, Clone)]
pub struct ChannelDevices {
    roots: DeviceRoots,
    major: u32,
}

impl ChannelDevices {
    pub fn open(roots: DeviceRoots) -> Result<Self, DeviceError> {
        let major = roots.imex_channels_major()?;
        Ok(Self { roots, major })
    }

    pub fn roots(&self) -> &DeviceRoots {
        &self.roots
    }

    pub fn major(&self) -> u32 {
        self.major
    }

    /// `channel`'s node, without touching the file system.
    pub fn node(&self, channel: u32) -> Result<ChannelNode, DeviceError> {
        if channel > MAX_MINOR {
            return Err(DeviceError::ChannelOutOfRange { channel });
        }
        Ok(ChannelNode {
            channel,
            host_path: self.roots.channel_path(channel),
            container_path: container_channel_path(channel),
            major: self.major,
            minor: channel,
        })
    }

    /// Make `channel`'s node unless a correct one is there. Safe to run beside another
    /// process doing the same.
    pub fn ensure(&self, channel: u32) -> Result<(ChannelNode, Ensured), DeviceError> {
        let node = self.node(channel)?;
        let dir = self.roots.channel_dir();
        fs::create_dir_all(&dir).map_err(|source| DeviceError::CreateDir { path: dir, source })?;
        if check_existing(&node)? {
            return Ok((node, Ensured::AlreadyThere));
        }
        let device = makedev(node.major.into(), node.minor.into());
        match mknod(
            &node.host_path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(CHANNEL_MODE),
            device,
        ) {
            Ok(()) => {}
            // Made by someone else since we looked: theirs must be right too.
            Err(Errno::EEXIST) if check_existing(&node)? => {
                return Ok((node, Ensured::AlreadyThere));
            }
            Err(errno) => return Err(mknod_error(&node.host_path, errno)),
        }
        // mknod's mode passes through the umask; the node's mode must not depend on it.
        fs::set_permissions(&node.host_path, fs::Permissions::from_mode(CHANNEL_MODE)).map_err(
            |source| DeviceError::SetMode {
                path: node.host_path.clone(),
                source,
            },
        )?;
        Ok((node, Ensured::Created))
    }
}

/// Whether a correct node is at `node.host_path`: `false` when nothing is, an error
/// when something else is.
fn check_existing(node: &ChannelNode) -> Result<bool, DeviceError> {
    let metadata = match fs::symlink_metadata(&node.host_path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(DeviceError::Inspect {
                path: node.host_path.clone(),
                source,
            });
        }
    };
    let rdev = metadata.rdev();
    if metadata.file_type().is_char_device()
        && major(rdev) == u64::from(node.major)
        && minor(rdev) == u64::from(node.minor)
    {
        return Ok(true);
    }
    Err(DeviceError::WrongNode {
        path: node.host_path.clone(),
        found: describe(&metadata),
        major: node.major,
        minor: node.minor,
    })
}

fn describe(metadata: &Metadata) -> String {
    let kind = metadata.file_type();
    let (major, minor) = (major(metadata.rdev()), minor(metadata.rdev()));
    if kind.is_char_device() {
        format!("a character device {major}:{minor}")
    } else if kind.is_block_device() {
        format!("a block device {major}:{minor}")
    } else if kind.is_dir() {
        "a directory".into()
    } else if kind.is_symlink() {
        "a symbolic link".into()
    } else if kind.is_fifo() {
        "a FIFO".into()
    } else if kind.is_socket() {
        "a socket".into()
    } else {
        "a regular file".into()
    }
}

fn mknod_error(path: &Path, errno: Errno) -> DeviceError {
    match errno {
        Errno::EPERM => DeviceError::MknodNotPermitted {
            path: path.to_owned(),
        },
        source => DeviceError::Mknod {
            path: path.to_owned(),
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// This machine's /proc/devices, with the driver's entries added.
    const PROC_DEVICES: &str = "Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
 10 misc
195 nvidia
234 nvidia-caps-imex-channels
235 nvidia-caps
509 nvidia-uvm

Block devices:
  7 loop
253 nvidia-caps-imex-channels-block
259 blkext
";

    fn origin() -> &'static Path {
        Path::new("/test/proc/devices")
    }

    fn major_of(text: &str) -> Result<u32, DeviceError> {
        char_device_major(text, IMEX_CHANNELS_DEVICE, origin())
    }

    #[test]
    fn finds_the_imex_channels_major() {
        assert_eq!(major_of(PROC_DEVICES).unwrap(), 234);
        assert_eq!(
            char_device_major(PROC_DEVICES, "nvidia-caps", origin()).unwrap(),
            235
        );
        assert_eq!(
            char_device_major(PROC_DEVICES, "/dev/vc/0", origin()).unwrap(),
            4
        );
    }

    #[test]
    fn block_devices_do_not_count() {
        let error = char_device_major(PROC_DEVICES, "loop", origin()).unwrap_err();
        assert!(
            matches!(error, DeviceError::MajorNotFound { .. }),
            "{error}"
        );
    }

    #[test]
    fn a_name_must_match_whole() {
        let text = "Character devices:\n234 nvidia-caps-imex-channels-x\n235 nvidia-caps-imex\n";
        assert!(matches!(
            major_of(text),
            Err(DeviceError::MajorNotFound { .. })
        ));
    }

    #[test]
    fn a_missing_major_is_a_clear_error_naming_file_and_device() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n\nBlock devices:\n  7 loop\n";
        let message = major_of(text).unwrap_err().to_string();
        assert!(message.contains("nvidia-caps-imex-channels"), "{message}");
        assert!(message.contains("/test/proc/devices"), "{message}");
        assert!(message.contains("NVIDIA driver is not loaded"), "{message}");
    }

    #[test]
    fn a_file_without_character_devices_is_not_proc_devices() {
        for text in ["", "Block devices:\n234 nvidia-caps-imex-channels\n"] {
            let error = major_of(text).unwrap_err();
            assert!(
                matches!(error, DeviceError::NoCharacterDevices { .. }),
                "{text:?}: {error}"
            );
        }
    }

    #[test]
    fn malformed_lines_are_errors_with_their_line_number() {
        for (line, problem) in [
            ("abc nvidia-caps-imex-channels", "the major is not a number"),
            ("-1 nvidia-caps-imex-channels", "the major is not a number"),
            ("234", "expected a major and a name"),
            ("4096 nvidia-caps-imex-channels", "larger than Linux allows"),
        ] {
            let text = format!("Character devices:\n  1 mem\n{line}\n");
            let error = major_of(&text).unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, DeviceError::Malformed { line: 3, .. }),
                "{message}"
            );
            assert!(message.contains(problem), "{message}");
            assert!(message.contains("/test/proc/devices, line 3"), "{message}");
        }
    }

    #[test]
    fn lines_outside_the_character_section_are_not_checked() {
        let text =
            "Character devices:\n234 nvidia-caps-imex-channels\n\nBlock devices:\nnot a line\n";
        assert_eq!(major_of(text).unwrap(), 234);
    }

    #[test]
    fn two_majors_for_one_name_are_an_error() {
        let text =
            "Character devices:\n234 nvidia-caps-imex-channels\n236 nvidia-caps-imex-channels\n";
        let message = major_of(text).unwrap_err().to_string();
        assert!(message.contains("234 and 236"), "{message}");
        let same =
            "Character devices:\n234 nvidia-caps-imex-channels\n234 nvidia-caps-imex-channels\n";
        assert_eq!(major_of(same).unwrap(), 234);
    }

    #[test]
    fn an_unreadable_proc_devices_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let roots = DeviceRoots {
            proc_devices: dir.path().join("devices"),
            dev: dir.path().join("dev"),
        };
        let message = ChannelDevices::open(roots).unwrap_err().to_string();
        assert!(
            message.contains(&format!(
                "cannot read {}",
                dir.path().join("devices").display()
            )),
            "{message}"
        );
    }

    #[test]
    fn paths_follow_the_roots_and_containers_see_dev() {
        let roots = DeviceRoots {
            proc_devices: "/host/proc/devices".into(),
            dev: "/host/dev".into(),
        };
        assert_eq!(
            roots.channel_path(7),
            Path::new("/host/dev/nvidia-caps-imex-channels/channel7")
        );
        assert_eq!(
            DeviceRoots::default().channel_path(0),
            Path::new("/dev/nvidia-caps-imex-channels/channel0")
        );
        assert_eq!(
            container_channel_path(2047),
            "/dev/nvidia-caps-imex-channels/channel2047"
        );
    }

    /// A temp root with a fake /proc/devices.
    fn fake_roots(dir: &Path) -> DeviceRoots {
        let roots = DeviceRoots {
            proc_devices: dir.join("devices"),
            dev: dir.join("dev"),
        };
        fs::write(&roots.proc_devices, PROC_DEVICES).unwrap();
        roots
    }

    #[test]
    fn node_describes_the_channel_for_cdi() {
        let dir = tempfile::tempdir().unwrap();
        let devices = ChannelDevices::open(fake_roots(dir.path())).unwrap();
        assert_eq!(devices.major(), 234);
        let node = devices.node(5).unwrap();
        assert_eq!(
            node,
            ChannelNode {
                channel: 5,
                host_path: dir.path().join("dev/nvidia-caps-imex-channels/channel5"),
                container_path: "/dev/nvidia-caps-imex-channels/channel5".into(),
                major: 234,
                minor: 5,
            }
        );
        assert!(!node.host_path.exists(), "node() must not touch the disk");
        assert!(matches!(
            devices.node(MAX_MINOR + 1),
            Err(DeviceError::ChannelOutOfRange { .. })
        ));
        assert!(devices.node(MAX_MINOR).is_ok());
    }

    #[test]
    fn eperm_from_mknod_says_what_to_do() {
        let message = mknod_error(Path::new("/dev/x/channel0"), Errno::EPERM).to_string();
        assert!(message.contains("/dev/x/channel0"), "{message}");
        assert!(message.contains("CAP_MKNOD"), "{message}");
        assert!(message.contains("privileged"), "{message}");
        let other = mknod_error(Path::new("/dev/x/channel0"), Errno::EROFS);
        assert!(matches!(
            other,
            DeviceError::Mknod {
                source: Errno::EROFS,
                ..
            }
        ));
    }

    /// mknod needs CAP_MKNOD: the tests that create device nodes are ignored unless
    /// asked for (`--ignored`), and then fail without root.
    fn assert_root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "creating device nodes needs root"
        );
    }

    #[test]
    #[ignore = "needs root: creates device nodes (CI runs it as root)"]
    fn ensure_creates_a_character_device_with_mode_0666() {
        assert_root();
        let dir = tempfile::tempdir().unwrap();
        let devices = ChannelDevices::open(fake_roots(dir.path())).unwrap();
        let (node, ensured) = devices.ensure(3).unwrap();
        assert_eq!(ensured, Ensured::Created);
        let metadata = fs::symlink_metadata(&node.host_path).unwrap();
        assert!(metadata.file_type().is_char_device());
        assert_eq!(major(metadata.rdev()), 234);
        assert_eq!(minor(metadata.rdev()), 3);
        // With the usual umask (022) mknod alone would give 0644.
        assert_eq!(metadata.permissions().mode() & 0o7777, CHANNEL_MODE);
    }

    #[test]
    #[ignore = "needs root: creates device nodes (CI runs it as root)"]
    fn ensure_leaves_a_correct_node_alone() {
        assert_root();
        let dir = tempfile::tempdir().unwrap();
        let devices = ChannelDevices::open(fake_roots(dir.path())).unwrap();
        let (node, _) = devices.ensure(0).unwrap();
        // A mode an admin chose is theirs to keep.
        fs::set_permissions(&node.host_path, fs::Permissions::from_mode(0o600)).unwrap();
        let before = fs::symlink_metadata(&node.host_path).unwrap();
        let (again, ensured) = devices.ensure(0).unwrap();
        assert_eq!(ensured, Ensured::AlreadyThere);
        assert_eq!(again, node);
        let after = fs::symlink_metadata(&node.host_path).unwrap();
        assert_eq!(after.ino(), before.ino());
        assert_eq!(after.permissions().mode() & 0o7777, 0o600);
    }

    #[test]
    #[ignore = "needs root: creates device nodes (CI runs it as root)"]
    fn ensure_refuses_a_wrong_node_and_says_what_it_found() {
        assert_root();
        let dir = tempfile::tempdir().unwrap();
        let devices = ChannelDevices::open(fake_roots(dir.path())).unwrap();
        let channel_dir = devices.roots().channel_dir();
        fs::create_dir_all(&channel_dir).unwrap();
        let path = |n: u32| devices.roots().channel_path(n);
        let mode = Mode::from_bits_truncate(0o666);
        mknod(&path(1), SFlag::S_IFCHR, mode, makedev(234, 9)).unwrap();
        mknod(&path(2), SFlag::S_IFCHR, mode, makedev(235, 2)).unwrap();
        mknod(&path(3), SFlag::S_IFBLK, mode, makedev(234, 3)).unwrap();
        fs::write(path(4), "").unwrap();
        fs::create_dir(path(5)).unwrap();
        symlink(path(1), path(6)).unwrap();
        for (channel, found) in [
            (1, "a character device 234:9"),
            (2, "a character device 235:2"),
            (3, "a block device 234:3"),
            (4, "a regular file"),
            (5, "a directory"),
            (6, "a symbolic link"),
        ] {
            let error = devices.ensure(channel).unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, DeviceError::WrongNode { .. }),
                "channel {channel}: {message}"
            );
            assert!(
                message.contains(&path(channel).display().to_string()),
                "{message}"
            );
            assert!(message.contains(&format!("is {found}, ")), "{message}");
            assert!(
                message.contains(&format!("needs a character device 234:{channel}")),
                "{message}"
            );
        }
        // Nothing was replaced.
        let kept = fs::symlink_metadata(path(1)).unwrap();
        assert_eq!(minor(kept.rdev()), 9);
    }
}
