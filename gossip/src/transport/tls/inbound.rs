//! One inbound connection: its TLS handshake, its frames read and held to the
//! certificate's node and the connection's address, and why a connection or frame was
//! refused.

use super::*;

pub(super) async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    _place: Admitted,
    shared: Arc<Shared>,
    inbound: mpsc::Sender<Inbound>,
) {
    let limits = &shared.limits;
    let acceptor = TlsAcceptor::from(shared.tls.material().server_config());
    let tls_stream = match timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls_stream)) => tls_stream,
        Ok(Err(error)) => {
            let reason = classify_handshake_error(&error);
            metrics::connection_refused(reason);
            warn!(%peer, reason = reason.as_str(), %error, "gossip TLS handshake refused");
            return;
        }
        Err(_) => {
            metrics::connection_refused(RefusedConnection::HandshakeTimeout);
            warn!(%peer, timeout = ?limits.handshake_timeout, "gossip peer did not complete the TLS handshake in time");
            return;
        }
    };
    let identity = tls_stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or_else(|| "no client certificate".to_owned())
        .and_then(|cert| node_name_of(cert).map_err(|e| e.to_string()));
    let node = match identity {
        Ok(node) => node,
        Err(error) => {
            metrics::connection_refused(RefusedConnection::BadIdentity);
            warn!(%peer, %error, "gossip peer's certificate names no node");
            return;
        }
    };
    debug!(%peer, %node, "gossip connection accepted");

    let mut frames = FramedRead::new(tls_stream, frame::codec(limits.max_frame_bytes));
    // The gossip address the peer sends from: where to look when the connection ends.
    let mut sent_from: Option<SocketAddr> = None;
    loop {
        let next = match timeout(limits.inbound_idle_timeout, frames.next()).await {
            Ok(next) => next,
            Err(_) => {
                debug!(%peer, %node, "closing idle gossip connection");
                return;
            }
        };
        let body = match next {
            None => {
                if let Some(from) = sent_from {
                    shared.check_gone(from);
                }
                return;
            }
            Some(Ok(body)) => body,
            Some(Err(error)) => {
                let partial = !frames.read_buffer().is_empty();
                report_read_error(&peer, &node, &error, partial);
                if let Some(from) = sent_from {
                    shared.check_gone(from);
                }
                return;
            }
        };
        metrics::frame_received(body.len() + 4);
        // With a state check, parts about this node are stripped there rather than
        // cost the whole frame.
        let receiver = shared.state.is_none().then_some(&shared.sender);
        let accepted = accept_frame(&body, &node, peer.ip(), receiver);
        if let Ok((version, _)) = &accepted
            && *version > frame::FRAME_VERSION
        {
            shared.newer.note(
                "frame",
                node.as_str(),
                u64::from(*version),
                u64::from(frame::FRAME_VERSION),
                1,
            );
        }
        match accepted.map(|(_, accepted)| accepted) {
            Ok(Accepted::Skipped) => {}
            Ok(Accepted::Chitchat(received)) => {
                shared.heard_from(received.from);
                sent_from = Some(received.from);
                let Some(held) = shared.inbound_budget.hold(received.size) else {
                    metrics::frame_dropped("inbound_queue_full");
                    continue;
                };
                match inbound.try_send(Inbound { received, held }) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        metrics::frame_dropped("inbound_queue_full")
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            // A closed pulse inbox means pulses stopped, not that the connection
            // should: chitchat may still be talking.
            Ok(Accepted::Pulse(from, pulse)) => {
                shared.heard_from(from);
                sent_from = Some(from);
                if let Err(mpsc::error::TrySendError::Full(_)) =
                    shared.pulses.try_send(PulseArrival::Pulse(from, pulse))
                {
                    metrics::frame_dropped("pulse_queue_full");
                }
            }
            Err(rejection) => {
                metrics::frame_rejected(rejection.reason);
                let news = shared
                    .refusals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .note(node.as_str(), rejection.reason, Instant::now());
                if news {
                    warn!(%peer, %node, reason = rejection.reason, error = %rejection.detail, "gossip frame refused; closing connection (further refusals of this peer for this reason are counted, not logged, until it stops for a minute)");
                } else {
                    debug!(%peer, %node, reason = rejection.reason, error = %rejection.detail, "gossip frame refused; closing connection");
                }
                return;
            }
        }
    }
}

pub(super) struct Rejection {
    pub(super) reason: &'static str,
    detail: String,
}

/// A frame that passed the checks, by what it carries.
pub(super) enum Accepted {
    Chitchat(Received),
    /// A pulse, with its sender's advertised address; read by the pulse task.
    Pulse(SocketAddr, Bytes),
    /// A kind of frame of a newer version, which this one does not read.
    Skipped,
}

/// Decodes a frame and checks that it speaks for the node its connection is
/// authenticated as, from the address that node advertises, and that chitchat can
/// apply it to `receiver`'s state without tripping one of its assertions (with no
/// receiver given, parts about the receiver are left to the state check). With the
/// frame's version.
pub(super) fn accept_frame(
    body: &[u8],
    authenticated: &NodeName,
    source_ip: IpAddr,
    receiver: Option<&ChitchatId>,
) -> Result<(u8, Accepted), Rejection> {
    let frame_error = |e: frame::FrameError| Rejection {
        reason: e.reason(),
        detail: e.to_string(),
    };
    let (header, message) = frame::split(body).map_err(frame_error)?;
    let sender = header.sender;
    if *sender.node_id != *authenticated.as_str() {
        return Err(Rejection {
            reason: "identity_mismatch",
            detail: format!(
                "frame claims to be from node {:?} but the certificate names {authenticated:?}",
                &*sender.node_id
            ),
        });
    }
    let advertised = sender.gossip_advertise_addr;
    if advertised.ip() != source_ip {
        return Err(Rejection {
            reason: "address_mismatch",
            detail: format!("frame advertises {advertised} but arrived from {source_ip}"),
        });
    }
    match header.carried {
        frame::Carried::Pulse => {
            let pulse = Bytes::copy_from_slice(message);
            return Ok((header.version, Accepted::Pulse(advertised, pulse)));
        }
        frame::Carried::Unknown(_) => return Ok((header.version, Accepted::Skipped)),
        frame::Carried::Chitchat => {}
    }
    // Before chitchat's own decoder, which inflates the delta without a bound.
    let carried = guard::check(message, receiver).map_err(|violation| Rejection {
        reason: violation.reason(),
        detail: violation.to_string(),
    })?;
    let wire = Bytes::copy_from_slice(message);
    let message = frame::decode_message(message).map_err(frame_error)?;
    Ok((
        header.version,
        Accepted::Chitchat(Received {
            from: advertised,
            message,
            size: wire.len() + carried,
            wire,
        }),
    ))
}

/// What the receiving side makes of one frame body, as [`accept_frame`] judges it on a
/// connection authenticated as `authenticated` from `source_ip`: the frame's version
/// and what it carries, or the refusal's `reason` label. Public for the fuzz targets
/// (`fuzz/`), which feed it bytes as a peer would.
pub fn judge_frame(
    body: &[u8],
    authenticated: &NodeName,
    source_ip: IpAddr,
    receiver: Option<&ChitchatId>,
) -> Result<(u8, Judged), &'static str> {
    accept_frame(body, authenticated, source_ip, receiver)
        .map(|(version, accepted)| {
            let judged = match accepted {
                Accepted::Chitchat(received) => Judged::Chitchat(received.message),
                Accepted::Pulse(_, pulse) => Judged::Pulse(pulse),
                Accepted::Skipped => Judged::Skipped,
            };
            (version, judged)
        })
        .map_err(|rejection| rejection.reason)
}

/// A frame [`judge_frame`] let through, by what it carries.
#[derive(Debug)]
pub enum Judged {
    /// A chitchat message, for chitchat's server.
    Chitchat(ChitchatMessage),
    /// A pulse's bytes, for the pulse task.
    Pulse(Bytes),
    /// A kind of frame of a newer version.
    Skipped,
}

pub(super) fn report_read_error(
    peer: &SocketAddr,
    node: &NodeName,
    error: &io::Error,
    partial: bool,
) {
    let oversized = error
        .get_ref()
        .is_some_and(|inner| inner.is::<LengthDelimitedCodecError>());
    let reason = if oversized {
        "oversized"
    } else if partial {
        "truncated"
    } else {
        // The connection broke between frames: nothing was lost that we had.
        debug!(%peer, %node, %error, "gossip connection closed");
        return;
    };
    metrics::frame_rejected(reason);
    warn!(%peer, %node, reason, %error, "gossip frame refused; closing connection");
}

pub(super) fn classify_handshake_error(error: &io::Error) -> RefusedConnection {
    use rustls::CertificateError as C;
    let Some(tls_error) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return RefusedConnection::HandshakeAborted;
    };
    match tls_error {
        rustls::Error::NoCertificatesPresented => RefusedConnection::NoClientCert,
        rustls::Error::InvalidCertificate(cert_error) => match cert_error {
            C::UnknownIssuer | C::BadSignature => RefusedConnection::UnknownCa,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => RefusedConnection::Expired,
            _ => RefusedConnection::TlsError,
        },
        _ => RefusedConnection::TlsError,
    }
}
