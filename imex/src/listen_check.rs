//! Before IMEX is started: can it listen where its config says?
//!
//! A daemon that cannot bind its port exits at once. Started anyway, it would look
//! like a daemon that crashed, and be restarted into the same wall. Checked first, the
//! start fails with the cause named, and the supervisor's backoff takes over.
//!
//! The usual culprit is not another IMEX but any socket on the node's address that
//! the kernel gave the port to as its ephemeral source port while IMEX was down: IMEX's
//! default ports (50000, 50005) lie inside Linux's default ephemeral range, and such a
//! connection can live for as long as it is used.
//!
//! The check binds without listening, with `SO_REUSEADDR`: a copy of the checking
//! socket can outlive our close, in a child that another thread is spawning (it holds
//! every descriptor from the fork until its exec closes them), and a *listening* copy
//! would keep IMEX from binding and take the connections meant for it. A bound,
//! non-listening copy with `SO_REUSEADDR` does neither to a listener that sets it too
//! (`testbed/src/rack/ports.rs` tests it with a copy held by a child).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use tokio::net::TcpSocket;

pub const IMEX_PORT_BUSY: &str = "domaind_imex_port_busy_total";

const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// Ok when `ip:port` can be listened on, as IMEX would (with SO_REUSEADDR, so
/// connections of a previous daemon that linger in TIME_WAIT do not count).
pub fn probe(ip: IpAddr, port: u16) -> io::Result<()> {
    bind_without_listening(SocketAddr::new(ip, port)).map(drop)
}

/// A socket bound to `addr` with `SO_REUSEADDR` that does not listen: what checks a
/// port for another process to take (see the module's doc).
pub fn bind_without_listening(addr: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// The start refused: `ip:port` cannot be listened on (`error`), held by `holders`
/// (described, empty when none could be seen). Counted.
pub fn refusal(ip: IpAddr, port: u16, what: &str, error: &std::io::Error, holders: &str) -> String {
    metrics::counter!(IMEX_PORT_BUSY).increment(1);
    busy_message(
        ip,
        port,
        what,
        error,
        holders,
        ephemeral_range(Path::new(EPHEMERAL_RANGE)),
    )
}

/// [`probe`], refused in words and counted.
pub fn check(ip: IpAddr, port: u16, what: &str) -> Result<(), String> {
    probe(ip, port).map_err(|error| refusal(ip, port, what, &error, ""))
}

/// The kernel's ephemeral port range, if it can be read.
pub fn ephemeral_range(path: &Path) -> Option<(u16, u16)> {
    parse_range(&std::fs::read_to_string(path).ok()?)
}

fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    match (bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => Some((low, high)),
        _ => None,
    }
}

fn busy_message(
    ip: IpAddr,
    port: u16,
    what: &str,
    error: &std::io::Error,
    holders: &str,
    ephemeral: Option<(u16, u16)>,
) -> String {
    let mut message = format!("IMEX cannot listen on {ip}:{port} ({what}): {error}");
    if !holders.is_empty() {
        message.push_str(&format!("; held by {holders}"));
    }
    message.push_str("; not starting it");
    if let Some((low, high)) = ephemeral
        && (low..=high).contains(&port)
    {
        message.push_str(&format!(
            "; the port is inside the ephemeral range {low}-{high}, so any connection \
             from this address may hold it: reserve it (sysctl \
             net.ipv4.ip_local_reserved_ports) or choose a port outside the range"
        ));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_parses_as_the_kernel_writes_it() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("junk"), None);
    }

    #[test]
    fn a_busy_port_inside_the_ephemeral_range_says_how_to_reserve_it() {
        let error = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let ip = IpAddr::from([10, 0, 0, 1]);
        let inside = busy_message(ip, 50000, "SERVER_PORT", &error, "", Some((32768, 60999)));
        assert!(inside.contains("10.0.0.1:50000 (SERVER_PORT)"), "{inside}");
        assert!(inside.contains("ip_local_reserved_ports"), "{inside}");
        let outside = busy_message(ip, 20000, "SERVER_PORT", &error, "", Some((32768, 60999)));
        assert!(!outside.contains("ephemeral"), "{outside}");
        let named = busy_message(ip, 20000, "SERVER_PORT", &error, "pid 7 (nc -l)", None);
        assert!(
            named.contains("; held by pid 7 (nc -l); not starting it"),
            "{named}"
        );
    }

    #[test]
    fn a_port_held_by_an_outgoing_connection_is_refused() {
        let ip = IpAddr::from([127, 0, 0, 1]);
        let listener = std::net::TcpListener::bind(SocketAddr::new(ip, 0)).unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let held = client.local_addr().unwrap().port();
        let error = check(ip, held, "SERVER_PORT").unwrap_err();
        assert!(
            error.contains(&format!("127.0.0.1:{held} (SERVER_PORT)")),
            "{error}"
        );
        assert!(error.contains("not starting it"), "{error}");
    }
}
