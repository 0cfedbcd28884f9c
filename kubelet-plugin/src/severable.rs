//! Connections that shutdown can cut. tonic runs each connection in a task of its own, so
//! stopping the accept loop leaves a connection with a call still running alive, and the
//! call with it. Every accepted stream is wrapped: once the token is cancelled its reads
//! and writes fail, hyper closes the connection, and the calls on it are dropped.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

pub(crate) struct Severable<S> {
    io: S,
    token: CancellationToken,
    severed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<S> std::fmt::Debug for Severable<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Severable")
            .field("severed", &self.token.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl<S> Severable<S> {
    pub(crate) fn new(io: S, token: &CancellationToken) -> Self {
        Self {
            io,
            token: token.clone(),
            severed: Box::pin(token.clone().cancelled_owned()),
        }
    }

    /// Fails once severed; otherwise registers the task to be woken when it is, so an
    /// idle connection waiting for bytes notices too.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.token.is_cancelled() || self.severed.as_mut().poll(cx).is_ready() {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the kubelet plugin server stopped",
            ))
        } else {
            Ok(())
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Severable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Severable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for Severable<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_severed_stream_fails_even_a_pending_read() {
        let token = CancellationToken::new();
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut ours = Severable::new(ours, &token);
        theirs.write_all(b"hi").await.unwrap();
        let mut buf = [0; 2];
        ours.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");

        let read = tokio::spawn(async move {
            let mut buf = [0; 1];
            ours.read(&mut buf).await
        });
        token.cancel();
        let error = read.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        drop(theirs);
    }

    #[tokio::test]
    async fn a_severed_stream_refuses_writes() {
        let token = CancellationToken::new();
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut ours = Severable::new(ours, &token);
        ours.write_all(b"ok").await.unwrap();
        token.cancel();
        let error = ours.write_all(b"no").await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
    }
}
