//! The `:authority` real clients send on unix sockets, made acceptable to h2.
//!
//! h2, under tonic, refuses a request whose `:authority` does not parse as a URI
//! authority with RST_STREAM PROTOCOL_ERROR (hyperium/h2#487, open, with no maintained
//! fix). Real clients of our sockets send such values: the kubelet's plugin watcher dials
//! the registration socket by its path, so grpc-go sends the percent-encoded path;
//! Python's grpc does the same on any unix socket. On a unix socket the authority names
//! nothing we route on, so every accepted stream passes through [`AuthorityFilter`]: it
//! decodes the client's header blocks and hands h2 the same headers, with an authority h2
//! cannot parse replaced by `localhost`. Everything else passes through byte for byte.
//!
//! HPACK keeps a table per direction that both ends must agree on, so once the filter
//! re-encodes one block it must re-encode all of them: h2's decoder then pairs with our
//! encoder, never with the client's. [`AuthorityRewriter`] is the pure part (bytes in,
//! bytes out); [`AuthorityFilter`] puts it on a stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use loona_hpack::decoder::DecoderError;
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Replacements, by socket (`dra`, `registration`): a client that is not the kubelet's DRA
/// manager (the plugin watcher, Python's grpc) shows up here.
pub const AUTHORITY_REWRITES_TOTAL: &str = "domaind_kubelet_authority_rewrites_total";
/// Connections closed because what the client sent was not HTTP/2 the filter could parse
/// (no preface, an HPACK block that does not decode, a header block interrupted).
pub const BAD_FRAMES_TOTAL: &str = "domaind_kubelet_bad_frames_total";

/// What a client that sends an unparsable `:authority` gets instead.
pub(crate) const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const PRIORITY_LEN: usize = 5;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// h2's SETTINGS_MAX_FRAME_SIZE, which tonic leaves at the protocol's default: no frame we
/// hand it may be larger.
const MAX_FRAME_TO_SERVER: usize = 16_384;
/// h2's SETTINGS_HEADER_TABLE_SIZE, the protocol's default: a client may not grow its
/// table past it, and our encoder's table is the same size as h2's decoder's.
const HEADER_TABLE_SIZE: usize = 4_096;
/// h2 refuses header lists over 16 KiB; a block four times that is not a request.
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The same bound on the list a block decodes to (each header counted as HPACK counts
/// it, name and value and 32): a block of one-byte references to a 4 KiB entry of the
/// table would otherwise decode to a quarter of a gigabyte.
const MAX_HEADER_LIST: usize = 64 * 1024;

/// Why a client's bytes could not be passed on.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AuthorityError {
    #[error("the client did not open with the HTTP/2 connection preface")]
    NoPreface,
    #[error("stream {stream}'s header block was interrupted by a frame of type {frame_type:#x}")]
    Interrupted { stream: u32, frame_type: u8 },
    #[error("a CONTINUATION frame on stream {stream} without a header block to continue")]
    StrayContinuation { stream: u32 },
    #[error("a header block of {len} bytes on stream {stream} (at most {MAX_HEADER_BLOCK})")]
    BlockTooLarge { stream: u32, len: usize },
    #[error(
        "stream {stream}'s header block decodes to more than {MAX_HEADER_LIST} bytes of headers"
    )]
    ListTooLarge { stream: u32 },
    #[error("a HEADERS frame on stream {stream} whose padding or priority overruns it")]
    BadPadding { stream: u32 },
    #[error("stream {stream}'s header block does not decode: {source}")]
    Hpack {
        stream: u32,
        #[source]
        source: DecoderError,
    },
}

/// A header block being gathered from a HEADERS frame and its CONTINUATIONs.
#[derive(Debug)]
struct HeaderBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
}

/// The client-to-server half of an HTTP/2 connection, with every header block decoded and
/// re-encoded and unparsable authorities replaced. Public for the fuzz targets (`fuzz/`).
pub struct AuthorityRewriter {
    preface_seen: usize,
    unparsed: BytesMut,
    /// Payload bytes of a frame passed through whose header has already gone out.
    passing: usize,
    block: Option<HeaderBlock>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl std::fmt::Debug for AuthorityRewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityRewriter")
            .field("preface_seen", &self.preface_seen)
            .field("unparsed", &self.unparsed.len())
            .field("passing", &self.passing)
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

impl Default for AuthorityRewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            preface_seen: 0,
            unparsed: BytesMut::new(),
            passing: 0,
            block: None,
            decoder,
            encoder: Encoder::new(),
        }
    }
}

impl AuthorityRewriter {
    /// Takes the client's next bytes and appends to `out` what the server should read.
    /// Returns how many authorities were replaced. After an error the connection is
    /// beyond repair: the caller closes it.
    pub fn feed(&mut self, input: &[u8], out: &mut BytesMut) -> Result<usize, AuthorityError> {
        self.unparsed.extend_from_slice(input);
        let mut replaced = 0;
        loop {
            if self.preface_seen < PREFACE.len() {
                let expected = &PREFACE[self.preface_seen..];
                let n = expected.len().min(self.unparsed.len());
                if self.unparsed[..n] != expected[..n] {
                    return Err(AuthorityError::NoPreface);
                }
                out.put(self.unparsed.split_to(n));
                self.preface_seen += n;
                if self.preface_seen < PREFACE.len() {
                    return Ok(replaced);
                }
                continue;
            }
            if self.passing > 0 {
                let n = self.passing.min(self.unparsed.len());
                if n == 0 {
                    return Ok(replaced);
                }
                out.put(self.unparsed.split_to(n));
                self.passing -= n;
                continue;
            }
            if self.unparsed.len() < FRAME_HEADER_LEN {
                return Ok(replaced);
            }
            let header = &self.unparsed[..FRAME_HEADER_LEN];
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let frame_type = header[3];
            let flags = header[4];
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            if frame_type != TYPE_HEADERS && frame_type != TYPE_CONTINUATION {
                if let Some(block) = &self.block {
                    return Err(AuthorityError::Interrupted {
                        stream: block.stream,
                        frame_type,
                    });
                }
                // Passed on as it comes: a DATA frame is never held back whole.
                out.put(self.unparsed.split_to(FRAME_HEADER_LEN));
                self.passing = len;
                continue;
            }
            if len > MAX_HEADER_BLOCK {
                return Err(AuthorityError::BlockTooLarge { stream, len });
            }
            if self.unparsed.len() < FRAME_HEADER_LEN + len {
                return Ok(replaced);
            }
            self.unparsed.advance(FRAME_HEADER_LEN);
            let payload = self.unparsed.split_to(len);
            replaced += self.header_frame(frame_type, flags, stream, &payload, out)?;
        }
    }

    fn header_frame(
        &mut self,
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut BytesMut,
    ) -> Result<usize, AuthorityError> {
        if frame_type == TYPE_HEADERS {
            if let Some(block) = &self.block {
                return Err(AuthorityError::Interrupted {
                    stream: block.stream,
                    frame_type,
                });
            }
            let (priority, fragment) = headers_payload(flags, stream, payload)?;
            self.block = Some(HeaderBlock {
                stream,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
            });
        } else {
            match self.block.as_mut() {
                Some(block) if block.stream == stream => block.fragment.extend_from_slice(payload),
                Some(block) => {
                    return Err(AuthorityError::Interrupted {
                        stream: block.stream,
                        frame_type,
                    });
                }
                None => return Err(AuthorityError::StrayContinuation { stream }),
            }
        }
        let gathered = self.block.as_ref().map_or(0, |block| block.fragment.len());
        if gathered > MAX_HEADER_BLOCK {
            return Err(AuthorityError::BlockTooLarge {
                stream,
                len: gathered,
            });
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(0);
        }
        let block = self.block.take().expect("a header block is being gathered");
        self.reencode(block, out)
    }

    fn reencode(
        &mut self,
        block: HeaderBlock,
        out: &mut BytesMut,
    ) -> Result<usize, AuthorityError> {
        let mut headers = Vec::new();
        let mut size = 0;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                // Past the bound, decoded on (the table must follow) but not kept.
                size += name.len() + value.len() + 32;
                if size <= MAX_HEADER_LIST {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|source| AuthorityError::Hpack {
                stream: block.stream,
                source,
            })?;
        if size > MAX_HEADER_LIST {
            return Err(AuthorityError::ListTooLarge {
                stream: block.stream,
            });
        }
        let mut replaced = 0;
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority" && !is_valid_authority(value) {
                *value = REPLACEMENT_AUTHORITY.to_vec();
                replaced += 1;
            }
        }
        let encoded = self.encoder.encode(
            headers
                .iter()
                .map(|(name, value)| (name.as_slice(), value.as_slice())),
        );
        write_header_frames(&block, &encoded, out);
        Ok(replaced)
    }
}

/// A HEADERS frame's priority and header block fragment, padding removed.
fn headers_payload(
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> Result<(Option<[u8; PRIORITY_LEN]>, &[u8]), AuthorityError> {
    let bad = || AuthorityError::BadPadding { stream };
    let mut body = payload;
    let mut padding = 0;
    if flags & FLAG_PADDED != 0 {
        let (&pad, rest) = body.split_first().ok_or_else(bad)?;
        padding = usize::from(pad);
        body = rest;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let (bytes, rest) = body.split_first_chunk::<PRIORITY_LEN>().ok_or_else(bad)?;
        priority = Some(*bytes);
        body = rest;
    }
    let end = body.len().checked_sub(padding).ok_or_else(bad)?;
    Ok((priority, &body[..end]))
}

/// One HEADERS frame and as many CONTINUATIONs as the block needs, none over the
/// server's frame size, without padding.
fn write_header_frames(block: &HeaderBlock, encoded: &[u8], out: &mut BytesMut) {
    let priority_len = block.priority.map_or(0, |_| PRIORITY_LEN);
    let first_len = encoded.len().min(MAX_FRAME_TO_SERVER - priority_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    put_frame_header(
        out,
        priority_len + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream,
    );
    if let Some(priority) = block.priority {
        out.put_slice(&priority);
    }
    out.put_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME_TO_SERVER));
        rest = tail;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        put_frame_header(out, chunk.len(), TYPE_CONTINUATION, flags, block.stream);
        out.put_slice(chunk);
    }
}

fn put_frame_header(out: &mut BytesMut, len: usize, frame_type: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).expect("frames are at most 16 KiB");
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(frame_type);
    out.put_u8(flags);
    out.put_u32(stream);
}

/// What h2 accepts: the same parse it does.
fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// An accepted stream whose reads go through an [`AuthorityRewriter`]; writes pass
/// through untouched.
pub(crate) struct AuthorityFilter<S> {
    io: S,
    socket: &'static str,
    rewriter: AuthorityRewriter,
    rewritten: BytesMut,
}

impl<S> std::fmt::Debug for AuthorityFilter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFilter")
            .field("socket", &self.socket)
            .field("rewriter", &self.rewriter)
            .finish_non_exhaustive()
    }
}

impl<S> AuthorityFilter<S> {
    /// `socket` labels the metrics: `dra` or `registration`.
    pub(crate) fn new(io: S, socket: &'static str) -> Self {
        Self {
            io,
            socket,
            rewriter: AuthorityRewriter::default(),
            rewritten: BytesMut::new(),
        }
    }
}

/// How much of the client's bytes one read takes: a kubelet call is a few hundred.
const READ_CHUNK: usize = 8 * 1024;

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFilter<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.rewritten.is_empty() {
                let n = this.rewritten.len().min(buf.remaining());
                buf.put_slice(&this.rewritten.split_to(n));
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            match this.rewriter.feed(read.filled(), &mut this.rewritten) {
                Ok(0) => {}
                Ok(replaced) => {
                    tracing::debug!(
                        socket = this.socket,
                        replaced,
                        "replaced an :authority h2 refuses"
                    );
                    metrics::counter!(AUTHORITY_REWRITES_TOTAL, "socket" => this.socket)
                        .increment(replaced as u64);
                }
                Err(error) => {
                    tracing::warn!(socket = this.socket, %error, "closing a kubelet socket connection");
                    metrics::counter!(BAD_FRAMES_TOTAL, "socket" => this.socket).increment(1);
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFilter<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<S: Connected> Connected for AuthorityFilter<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests;
