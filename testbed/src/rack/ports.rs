//! Ports for the processes a rack (or a test) starts: chosen here, bound there.
//!
//! A port is found free by binding it, and handed over by closing that socket. The
//! socket never listens and sets `SO_REUSEADDR`
//! ([`domaind_imex::listen_check::bind_without_listening`], whose module says why): a
//! copy left in a child that another thread was spawning once kept the IMEX
//! simulator of a test from binding its port and took the test's connection, so that
//! a clean SIGTERM read as exit status 1.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context as _, bail};

use domaind_imex::listen_check::bind_without_listening as bound;

/// A port the kernel gives out (from its ephemeral range) that is free on every one of
/// `ips`.
pub fn free_port(ips: &[IpAddr]) -> anyhow::Result<u16> {
    for _ in 0..100 {
        let first = bound(SocketAddr::new(ips[0], 0))
            .with_context(|| format!("cannot bind {}: is 127.0.0.0/8 routed to lo?", ips[0]))?;
        let port = first.local_addr()?.port();
        drop(first);
        if free_on_all(ips, port) {
            return Ok(port);
        }
    }
    bail!("no port is free on all of {ips:?}")
}

/// Whether `port` can be bound on every one of `ips` now.
pub fn free_on_all(ips: &[IpAddr], port: u16) -> bool {
    ips.iter()
        .all(|ip| bound(SocketAddr::new(*ip, port)).is_ok())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd as _;
    use std::process::{Command, Stdio};

    use super::*;

    /// What a sibling thread's spawn does to the socket that found the port: a child
    /// holds a copy of it (here for good, as its stdin) after we closed ours. The port
    /// must still go to the daemon that binds it, and connections to it reach that
    /// daemon alone.
    #[tokio::test]
    async fn a_copy_of_the_checking_socket_left_in_a_child_leaves_the_port_to_its_daemon() {
        let ip = IpAddr::from([127, 0, 0, 1]);
        let checking = bound(SocketAddr::new(ip, 0)).unwrap();
        let port = checking.local_addr().unwrap().port();
        let copy = checking.as_fd().try_clone_to_owned().unwrap();
        let mut holder = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::from(copy))
            .spawn()
            .unwrap();
        drop(checking);
        let daemon = tokio::net::TcpListener::bind(SocketAddr::new(ip, port)).await;
        let connected = tokio::net::TcpStream::connect(SocketAddr::new(ip, port)).await;
        holder.kill().unwrap();
        holder.wait().unwrap();
        let daemon = daemon.expect("the daemon binds the port while the copy lives");
        connected.expect("a connection reaches the daemon");
        daemon.accept().await.expect("the daemon accepts it");
    }

    #[test]
    fn a_free_port_is_free_on_every_address() {
        let ips = [IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2])];
        let port = free_port(&ips).unwrap();
        assert!(free_on_all(&ips, port));
        let taken = std::net::TcpListener::bind(SocketAddr::new(ips[1], port)).unwrap();
        assert!(
            !free_on_all(&ips, port),
            "a listener on one address takes it"
        );
        drop(taken);
    }
}
