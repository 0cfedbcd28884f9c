//! Who holds a TCP port on an address: the kernel's socket tables (`/proc/net/tcp`,
//! `/proc/net/tcp6`) give the sockets bound there and their inodes, and a process's
//! open descriptors (`/proc/<pid>/fd/*` → `socket:[inode]`) say whose they are.
//!
//! Used when IMEX's port is taken: a daemon of ours that a killed domaind left is
//! stopped ([`super::leftover`]); anything else is named in the error, so that an
//! operator knows what to stop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// A process holding a socket on the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    /// Its command line, arguments joined by spaces (cut for messages).
    pub command: String,
}

/// The longest command line a message carries.
const COMMAND_CHARS: usize = 120;

/// The inodes of the sockets in a `/proc/net/tcp{,6}` table whose local address
/// conflicts with listening on `ip:port`: bound to that address or to the wildcard.
/// Sockets without an inode (TIME_WAIT) hold nothing a listener with SO_REUSEADDR
/// minds, and are left out.
pub fn socket_inodes(table: &str, ip: IpAddr, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = parse_address(fields.get(1)?)?;
            let inode: u64 = fields.get(9)?.parse().ok()?;
            let conflicts = local.port() == port
                && (local.ip() == ip || local.ip().is_unspecified() || mapped(local.ip()) == ip);
            (conflicts && inode != 0).then_some(inode)
        })
        .collect()
}

/// An IPv4 address mapped into IPv6 (a dual-stack socket), as IPv4.
fn mapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `0100007F:C350` or the IPv6 form: the kernel prints the address as the 32-bit words
/// of the network-order bytes in host order, and the port in hex.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..address.len() / 8)
        .map(|i| u32::from_str_radix(address.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip = match (address.len(), bytes.as_slice()) {
        (8, [a, b, c, d]) => IpAddr::V4(Ipv4Addr::new(*a, *b, *c, *d)),
        (32, _) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The processes holding a socket that keeps `ip:port` from being listened on. Only
/// processes whose descriptors this process may read are seen (all of them as root).
pub fn holders(ip: IpAddr, port: u16) -> Vec<Holder> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(socket_inodes(&text, ip, port));
        }
    }
    if inodes.is_empty() {
        return Vec::new();
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            holds_any(&entry.path().join("fd"), &wanted).then(|| Holder {
                pid,
                command: command_of(pid),
            })
        })
        .collect()
}

fn holds_any(fd_dir: &Path, wanted: &[String]) -> bool {
    let Ok(fds) = std::fs::read_dir(fd_dir) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
    })
}

fn command_of(pid: i32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let line = crate::procfs::command_line_args(&cmdline)
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    let mut cut: String = line.chars().take(COMMAND_CHARS).collect();
    if cut.len() < line.len() {
        cut.push('…');
    }
    cut
}

/// The holders, in words: `pid 42 (nc -l 50000), pid 43 (...)`.
pub fn describe(holders: &[Holder]) -> String {
    holders
        .iter()
        .map(|h| format!("pid {} ({})", h.pid, h.command))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as the kernel writes them (x86-64, little-endian), header included.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:C350 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0200007F:C350 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 100 0 0 10 0
   2: 00000000:C355 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 100 0 0 10 0
   3: 0100007F:C350 0100007F:9C40 06 00000000:00000000 03:00000DC8 00000000     0        0 0 3 0000000000000000
";

    #[test]
    fn sockets_on_the_address_or_the_wildcard_hold_the_port() {
        if cfg!(target_endian = "big") {
            return;
        }
        let ip = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(socket_inodes(TCP, ip, 50000), vec![1111]);
        assert_eq!(
            socket_inodes(TCP, IpAddr::from([127, 0, 0, 2]), 50000),
            vec![2222]
        );
        // 0.0.0.0:50005 holds the port on every address.
        assert_eq!(socket_inodes(TCP, ip, 50005), vec![3333]);
        assert!(socket_inodes(TCP, ip, 40000).is_empty());
        assert!(socket_inodes("garbage\nmore garbage", ip, 50000).is_empty());
    }

    #[test]
    fn ipv6_addresses_parse_and_mapped_ipv4_counts_as_ipv4() {
        if cfg!(target_endian = "big") {
            return;
        }
        // ::ffff:127.0.0.1 port 50000, and [::]:50005.
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:C350 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1
   1: 00000000000000000000000000000000:C355 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1
";
        let ip = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(socket_inodes(tcp6, ip, 50000), vec![4444]);
        assert_eq!(socket_inodes(tcp6, ip, 50005), vec![5555]);
    }

    #[test]
    fn a_listener_of_this_process_is_found_with_its_command_line() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let found = holders(IpAddr::from([127, 0, 0, 1]), port);
        let me = std::process::id() as i32;
        assert!(found.iter().any(|h| h.pid == me), "{found:?}");
        assert!(describe(&found).contains(&format!("pid {me} (")));
        drop(listener);
        assert!(holders(IpAddr::from([127, 0, 0, 1]), port).is_empty());
    }
}
