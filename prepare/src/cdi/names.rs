//! CDI names: the kind (`<vendor>/<class>`), claim UIDs, device names and spec file
//! names, with the CDI specification's syntax rules.

use std::fmt;
use std::str::FromStr;

use super::CdiError;

/// The CDI class of the devices of one prepared claim.
pub const CLASS: &str = "claim";

/// Kubernetes limits DRA driver names to this many characters; it also keeps spec
/// file names, and their temporary files, well under the 255-byte file name limit.
const MAX_DRIVER_LEN: usize = 63;

/// Kubernetes UIDs are 36-character UUIDs; the margin is for test harnesses, the bound
/// for file name length.
const MAX_CLAIM_UID_LEN: usize = 128;

const SPEC_EXTENSION: &str = ".json";

fn is_alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

/// The CDI rule for a device name: letters, digits, `_ - . :`, starting and ending
/// with a letter or digit. (A leading digit needs CDI 0.5.0.)
pub fn check_device_name(name: &str) -> Result<(), &'static str> {
    let bytes = name.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return Err("it is empty");
    };
    if !bytes
        .iter()
        .all(|&c| is_alnum(c) || matches!(c, b'_' | b'-' | b'.' | b':'))
    {
        return Err("it has a character other than letters, digits, '_', '-', '.' and ':'");
    }
    if !is_alnum(first) || !is_alnum(last) {
        return Err("it must start and end with a letter or digit");
    }
    Ok(())
}

/// The CDI rule for a vendor or class name: letters, digits, `_ - .`, starting with a
/// letter and ending with a letter or digit.
pub fn check_vendor_or_class(name: &str) -> Result<(), &'static str> {
    let bytes = name.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return Err("it is empty");
    };
    if !bytes
        .iter()
        .all(|&c| is_alnum(c) || matches!(c, b'_' | b'-' | b'.'))
    {
        return Err("it has a character other than letters, digits, '_', '-' and '.'");
    }
    if !first.is_ascii_alphabetic() || !is_alnum(last) {
        return Err("it must start with a letter and end with a letter or digit");
    }
    Ok(())
}

/// A claim UID fit to name CDI devices and files: no path separators, nothing a CDI
/// parser rejects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimUid(String);

impl ClaimUid {
    pub fn new(uid: &str) -> Result<Self, CdiError> {
        let invalid = |reason| CdiError::InvalidClaimUid {
            uid: uid.to_owned(),
            reason,
        };
        if uid.len() > MAX_CLAIM_UID_LEN {
            return Err(invalid("it is longer than 128 characters"));
        }
        check_device_name(uid).map_err(invalid)?;
        Ok(Self(uid.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ClaimUid {
    type Err = CdiError;
    fn from_str(uid: &str) -> Result<Self, Self::Err> {
        Self::new(uid)
    }
}

impl fmt::Display for ClaimUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The CDI kind of our claim devices: `k8s.<driver>/claim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    vendor: String,
}

impl Kind {
    /// The kind for the DRA driver `driver`, a DNS subdomain.
    pub fn for_driver(driver: &str) -> Result<Self, CdiError> {
        let invalid = |reason| CdiError::InvalidDriver {
            driver: driver.to_owned(),
            reason,
        };
        let bytes = driver.as_bytes();
        if bytes.is_empty() {
            return Err(invalid("it is empty"));
        }
        if bytes.len() > MAX_DRIVER_LEN {
            return Err(invalid("it is longer than 63 characters"));
        }
        if !bytes
            .iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'.'))
        {
            return Err(invalid(
                "it has a character other than lowercase letters, digits, '-' and '.'",
            ));
        }
        if driver
            .split('.')
            .any(|label| label.is_empty() || label.starts_with('-') || label.ends_with('-'))
        {
            return Err(invalid(
                "each dot-separated part must be non-empty and start and end with a letter or digit",
            ));
        }
        let vendor = format!("k8s.{driver}");
        check_vendor_or_class(&vendor).map_err(invalid)?;
        Ok(Self { vendor })
    }

    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    pub fn class(&self) -> &'static str {
        CLASS
    }

    /// The fully qualified CDI device id, `<vendor>/<class>=<name>`, that the kubelet
    /// hands to the container runtime.
    pub fn device_id(&self, device_name: &str) -> String {
        format!("{self}={device_name}")
    }

    /// `<vendor>-<class>_<claim uid>.json`: the name CDI tooling gives a transient
    /// spec, one per claim.
    pub(crate) fn spec_file_name(&self, claim: &ClaimUid) -> String {
        format!("{}{claim}{SPEC_EXTENSION}", self.spec_file_prefix())
    }

    /// The claim whose spec `file_name` is, or none for any other file.
    pub(crate) fn claim_of_spec_file(&self, file_name: &str) -> Option<ClaimUid> {
        let uid = file_name
            .strip_prefix(&self.spec_file_prefix())?
            .strip_suffix(SPEC_EXTENSION)?;
        ClaimUid::new(uid).ok()
    }

    fn spec_file_prefix(&self) -> String {
        format!("{}-{}_", self.vendor, CLASS)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, CLASS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_kube_api::names::DEFAULT_DRIVER_NAME;

    #[test]
    fn kubelet_uids_are_accepted_as_they_are() {
        for uid in [
            "3f1c0a52-9d7e-4c55-8f0e-2b6a1d9e4c10",
            "A1B2C3D4-E5F6-4A7B-8C9D-0E1F2A3B4C5D",
            "a",
            "uid_with.dots:and-colons",
        ] {
            assert_eq!(ClaimUid::new(uid).unwrap().as_str(), uid);
        }
    }

    #[test]
    fn uids_that_would_break_names_or_paths_are_refused() {
        let too_long = "a".repeat(129);
        for uid in [
            "",
            "../etc/passwd",
            "a/b",
            "..",
            ".hidden",
            "-leading-dash",
            "trailing-dash-",
            "trailing.",
            "has space",
            "new\nline",
            "nul\0byte",
            "équipe",
            "a=b",
            "a,b",
            too_long.as_str(),
        ] {
            let error = ClaimUid::new(uid).expect_err(uid);
            let message = error.to_string();
            assert!(
                message.contains("invalid claim UID") && message.contains(&format!("{uid:?}")),
                "{message}"
            );
        }
        assert!(ClaimUid::new(&"a".repeat(128)).is_ok());
    }

    #[test]
    fn the_default_kind_is_nvidias() {
        let kind = Kind::for_driver(DEFAULT_DRIVER_NAME).unwrap();
        assert_eq!(kind.vendor(), "k8s.compute-domain.nvidia.com");
        assert_eq!(kind.class(), "claim");
        assert_eq!(kind.to_string(), "k8s.compute-domain.nvidia.com/claim");
        assert_eq!(
            kind.device_id("u-channel-0"),
            "k8s.compute-domain.nvidia.com/claim=u-channel-0"
        );
    }

    #[test]
    fn the_vendor_follows_the_driver_name() {
        let kind = Kind::for_driver("imex.example.org").unwrap();
        assert_eq!(kind.to_string(), "k8s.imex.example.org/claim");
        assert!(Kind::for_driver(&format!("{}.io", "a".repeat(60))).is_ok());
    }

    #[test]
    fn driver_names_that_are_not_dns_subdomains_are_refused() {
        let too_long = format!("{}.io", "a".repeat(61));
        for driver in [
            "",
            "Compute-Domain.nvidia.com",
            "compute_domain.nvidia.com",
            "compute-domain.nvidia.com.",
            ".nvidia.com",
            "-a.nvidia.com",
            "a-.nvidia.com",
            "a..b",
            "a/b",
            too_long.as_str(),
        ] {
            let error = Kind::for_driver(driver).expect_err(driver);
            assert!(
                error.to_string().contains("invalid DRA driver name"),
                "{error}"
            );
        }
    }

    #[test]
    fn spec_file_names_map_back_to_their_claim() {
        let kind = Kind::for_driver(DEFAULT_DRIVER_NAME).unwrap();
        let claim = ClaimUid::new("3f1c0a52-9d7e-4c55-8f0e-2b6a1d9e4c10").unwrap();
        let name = kind.spec_file_name(&claim);
        assert_eq!(
            name,
            "k8s.compute-domain.nvidia.com-claim_3f1c0a52-9d7e-4c55-8f0e-2b6a1d9e4c10.json"
        );
        assert_eq!(kind.claim_of_spec_file(&name), Some(claim));

        let other = Kind::for_driver("gpu.nvidia.com").unwrap();
        for foreign in [
            other.spec_file_name(&ClaimUid::new("x").unwrap()),
            "k8s.compute-domain.nvidia.com-claim_.json".to_owned(),
            "k8s.compute-domain.nvidia.com-claim_x.yaml".to_owned(),
            "k8s.compute-domain.nvidia.com-claim_-x.json".to_owned(),
            "nvidia.yaml".to_owned(),
        ] {
            assert_eq!(kind.claim_of_spec_file(&foreign), None, "{foreign}");
        }
    }

    #[test]
    fn device_and_vendor_rules_follow_cdi() {
        assert!(check_device_name("0abc").is_ok());
        assert!(check_device_name("a:b.c_d-e").is_ok());
        assert!(check_device_name("a/b").is_err());
        assert!(check_device_name("a:").is_err());
        assert!(check_vendor_or_class("k8s.example.com").is_ok());
        assert!(check_vendor_or_class("0vendor").is_err());
        assert!(check_vendor_or_class("a:b").is_err());
    }
}
