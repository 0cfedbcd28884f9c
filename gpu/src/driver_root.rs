//! Where NVML lies in a driver root: the host's (or the GPU operator's driver
//! container's) files, mounted into the daemon's container.
//!
//! The container cannot put the driver root's library directories on its loader's search
//! path: they hold that root's own glibc, which would then be loaded beside the image's
//! dynamic loader. So NVML is looked up here, by path, and loaded alone.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where the chart mounts the driver root (`node.driverRoot`), and the default of
/// `--driver-root`.
pub const DEFAULT_DRIVER_ROOT: &str = "/driver-root";

/// The library directories of a driver root, relative to it, in search order: RPM
/// layouts, then Debian's multiarch ones for x86_64 and aarch64 (GB200 and GB300 nodes
/// have Grace CPUs), then the same under /lib for roots without a merged /usr.
pub const DRIVER_ROOT_LIBRARY_DIRS: &[&str] = &[
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
];

/// The paths to try for `library` under `driver_root`, in order. Only a bare file name
/// is searched for: a path names exactly the file to load.
pub fn driver_root_candidates(library: &Path, driver_root: &Path) -> Vec<PathBuf> {
    let mut components = library.components();
    let bare_name = matches!(
        (components.next(), components.next()),
        (Some(std::path::Component::Normal(_)), None)
    );
    if !bare_name {
        return Vec::new();
    }
    DRIVER_ROOT_LIBRARY_DIRS
        .iter()
        .map(|dir| driver_root.join(dir).join(library))
        .collect()
}

/// What looking in the driver root found, for the error that says where NVML was
/// looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverRootSearch {
    /// Not looked in: no driver root configured, or the library was given as a path.
    NotSearched,
    /// The driver root is not there: nothing is mounted at it.
    Missing(PathBuf),
    /// The driver root is there, and none of its library directories holds the library.
    NotFound(PathBuf),
}

impl fmt::Display for DriverRootSearch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotSearched => Ok(()),
            Self::Missing(root) => write!(f, "; nothing is mounted at {}", root.display()),
            Self::NotFound(root) => write!(
                f,
                "; nor is it in the driver root {} ({})",
                root.display(),
                DRIVER_ROOT_LIBRARY_DIRS.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_looked_for_in_every_library_directory_in_order() {
        let candidates =
            driver_root_candidates(Path::new("libnvidia-ml.so.1"), Path::new("/driver-root"));
        let expected: Vec<PathBuf> = [
            "/driver-root/usr/lib64/libnvidia-ml.so.1",
            "/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "/driver-root/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
            "/driver-root/lib64/libnvidia-ml.so.1",
            "/driver-root/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "/driver-root/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(candidates, expected);
    }

    #[test]
    fn a_path_is_loaded_as_given_and_not_searched_for() {
        for library in [
            "/opt/nvidia/libnvidia-ml.so.1",
            "lib/libnvidia-ml.so.1",
            "./libnvidia-ml.so.1",
        ] {
            assert!(
                driver_root_candidates(Path::new(library), Path::new("/driver-root")).is_empty(),
                "{library}"
            );
        }
    }

    #[test]
    fn the_search_says_where_it_looked() {
        assert_eq!(DriverRootSearch::NotSearched.to_string(), "");
        assert_eq!(
            DriverRootSearch::Missing("/driver-root".into()).to_string(),
            "; nothing is mounted at /driver-root"
        );
        let not_found = DriverRootSearch::NotFound("/run/nvidia/driver".into()).to_string();
        assert!(
            not_found.starts_with(
                "; nor is it in the driver root /run/nvidia/driver (usr/lib64, \
                 usr/lib/x86_64-linux-gnu, "
            ),
            "{not_found}"
        );
    }
}
