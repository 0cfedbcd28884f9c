//! One peer's writer: its queue drained over a connection made on demand, backed off
//! after failures, closed when idle, from a source port the peer will not mistake.

use super::*;

/// One outbound connection: frames go out on the write half; the read half carries
/// nothing from the peer but TLS records, and ends when the peer's end closes.
pub(super) struct Outbound {
    pub(super) writer: FramedWrite<WriteHalf<TlsClient>, tokio_util::codec::LengthDelimitedCodec>,
    pub(super) closed: ReadHalf<TlsClient>,
}

/// Resolves once the peer's end of an outbound connection closed or broke: with
/// `true` when it went away (a close, a reset), which a dead process does, and `false`
/// when it refused us in TLS (an alert: it does not trust our certificate, say), which
/// says nothing about whether it lives.
pub(super) async fn until_closed(closed: &mut ReadHalf<TlsClient>) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match closed.read(&mut buf).await {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) => {
                return matches!(
                    error.kind(),
                    io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::BrokenPipe
                );
            }
        }
    }
}

/// Drains one peer's queue into one connection, (re)connecting on demand. After a
/// failed connect, frames are dropped until the backoff's next attempt, or until the
/// peer speaks to us: it is up, and what we would drop may be our answers to its
/// exchanges (dropped, the two would learn each other's news only at the next round).
pub(super) async fn write_to_peer(
    peer: SocketAddr,
    mut queue: mpsc::Receiver<Bytes>,
    shared: Arc<Shared>,
) {
    let limits = &shared.limits;
    let mut connection: Option<Outbound> = None;
    let mut backoff = Backoff::new(limits.reconnect_backoff_min, limits.reconnect_backoff_max);
    // The last failed connect, and when the backoff allows the next.
    let mut failed: Option<(Instant, Instant)> = None;
    loop {
        let next = tokio::select! {
            next = timeout(limits.outbound_idle_timeout, queue.recv()) => next,
            went_away = async {
                match connection.as_mut() {
                    Some(open) => until_closed(&mut open.closed).await,
                    None => std::future::pending().await,
                }
            } => {
                debug!(%peer, went_away, "gossip peer closed our connection");
                connection = None;
                // Its daemon died, or it closed an idle connection: a dial tells which.
                if went_away {
                    shared.check_gone(peer);
                }
                continue;
            }
        };
        let body = match next {
            Ok(Some(body)) => body,
            // The socket was dropped.
            Ok(None) => return,
            Err(_) => {
                if connection.is_some() {
                    debug!(%peer, "closing idle gossip connection");
                }
                return;
            }
        };
        if connection.is_none() {
            if let Some((at, next)) = failed
                && Instant::now() < next
                && !shared.heard_since(peer, at)
            {
                metrics::frame_dropped("peer_unreachable");
                continue;
            }
            match timeout(limits.connect_timeout, connect(peer, &shared)).await {
                Ok(Ok(open)) => {
                    if backoff.failures() > 0 {
                        info!(%peer, "gossip peer reachable again");
                    }
                    backoff.succeed();
                    failed = None;
                    connection = Some(open);
                }
                outcome => {
                    let error = match outcome {
                        Ok(Err(error)) => {
                            if error.kind() == io::ErrorKind::ConnectionRefused {
                                shared.tell_gone(peer);
                            }
                            error.to_string()
                        }
                        _ => format!("timed out after {:?}", limits.connect_timeout),
                    };
                    metrics::connect_failed();
                    metrics::frame_dropped("peer_unreachable");
                    let delay = backoff.fail();
                    if backoff.failures() == 1 {
                        warn!(%peer, %error, retry_in = ?delay, "cannot connect to gossip peer");
                    } else {
                        debug!(%peer, %error, retry_in = ?delay, "cannot connect to gossip peer");
                    }
                    let now = Instant::now();
                    failed = Some((now, now + delay));
                    continue;
                }
            }
        }
        let Some(open) = connection.as_mut() else {
            continue;
        };
        let size = body.len() + 4;
        match timeout(limits.write_timeout, open.writer.send(body)).await {
            Ok(Ok(())) => metrics::frame_sent(size),
            outcome => {
                let error = match outcome {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("timed out after {:?}", limits.write_timeout),
                };
                debug!(%peer, %error, "gossip write failed; reconnecting on the next frame");
                metrics::frame_dropped("write_failed");
                connection = None;
            }
        }
    }
}

pub(super) async fn connect(peer: SocketAddr, shared: &Shared) -> io::Result<Outbound> {
    // Receivers check that a frame comes from the IP it advertises.
    let socket = bind_source(shared.sender.gossip_advertise_addr.ip(), |port| {
        shared.limits.avoid_source_ports.contains(&port)
    })?;
    let stream = socket.connect(peer).await?;
    stream.set_nodelay(true)?;
    let connector = TlsConnector::from(shared.tls.material().client_config());
    // The name is not checked: any node of our CA may listen at a gossip address, and
    // what it says is checked against its certificate when it speaks to us.
    let tls_stream = connector
        .connect(ServerName::IpAddress(peer.ip().into()), stream)
        .await?;
    let (closed, writer) = tokio::io::split(tls_stream);
    Ok(Outbound {
        writer: FramedWrite::new(writer, frame::codec(shared.limits.max_frame_bytes)),
        closed,
    })
}

/// Peers remembered as heard from before the old ones are pruned: well above an NVL72
/// rack's 18 nodes.
pub(super) const HEARD_PRUNE_AT: usize = 256;

/// Tries before a source port to avoid is taken anyway (the range is nearly full).
pub(super) const SOURCE_PORT_TRIES: usize = 8;

/// A socket bound to `ip` and a port the kernel chose, not one that `avoid` names.
/// Refused sockets stay bound until the choice is made, so that the kernel offers
/// another port each time.
pub(super) fn bind_source(ip: IpAddr, avoid: impl Fn(u16) -> bool) -> io::Result<TcpSocket> {
    let mut refused = Vec::new();
    loop {
        let socket = if ip.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(ip, 0))?;
        let port = socket.local_addr()?.port();
        if !avoid(port) {
            return Ok(socket);
        }
        if refused.len() == SOURCE_PORT_TRIES {
            warn!(
                port,
                "gossip connection takes a source port that should stay free"
            );
            return Ok(socket);
        }
        refused.push(socket);
    }
}
