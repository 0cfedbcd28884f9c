use super::*;

/// What grpc-go sends when the kubelet's plugin watcher dials a registration socket.
const KUBELET_AUTHORITY: &[u8] =
    b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fcompute-domain.nvidia.com-reg.sock";

const SETTINGS_FRAME: [u8; 9] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];

fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_vec(), v.to_vec()))
    .collect()
}

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    put_frame_header(&mut out, payload.len(), frame_type, flags, stream);
    out.put_slice(payload);
    out.to_vec()
}

/// A client's side: its own HPACK encoder, as a real client has.
struct Client {
    encoder: Encoder<'static>,
}

impl Client {
    fn new() -> Self {
        Self {
            encoder: Encoder::new(),
        }
    }

    fn block(&mut self, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        self.encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    fn headers(
        &mut self,
        stream: u32,
        headers: &[(Vec<u8>, Vec<u8>)],
        end_stream: bool,
    ) -> Vec<u8> {
        let flags = FLAG_END_HEADERS | if end_stream { FLAG_END_STREAM } else { 0 };
        frame(TYPE_HEADERS, flags, stream, &self.block(headers))
    }
}

/// The server's side: splits what the filter produced into frames and decodes header
/// blocks with one decoder for the connection, as h2 does.
#[derive(Debug, PartialEq)]
enum Seen {
    Headers {
        stream: u32,
        flags: u8,
        priority: Option<[u8; 5]>,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Other {
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    },
}

/// A header block the server is gathering: stream, flags, priority, fragment.
type OpenBlock = (u32, u8, Option<[u8; 5]>, Vec<u8>);

fn server_view(bytes: &[u8]) -> Vec<Seen> {
    assert!(bytes.starts_with(PREFACE), "the preface goes first");
    let mut rest = &bytes[PREFACE.len()..];
    let mut decoder = Decoder::new();
    let mut seen = Vec::new();
    let mut open: Option<OpenBlock> = None;
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        assert!(len <= MAX_FRAME_TO_SERVER, "a frame of {len} bytes");
        let (frame_type, flags) = (rest[3], rest[4]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        let payload = &rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
        rest = &rest[FRAME_HEADER_LEN + len..];
        match frame_type {
            TYPE_HEADERS => {
                assert!(open.is_none());
                assert_eq!(flags & FLAG_PADDED, 0, "padding is dropped");
                let (priority, fragment) = headers_payload(flags, stream, payload).unwrap();
                open = Some((stream, flags, priority, fragment.to_vec()));
            }
            TYPE_CONTINUATION => {
                let block = open
                    .as_mut()
                    .expect("a CONTINUATION follows a HEADERS frame");
                assert_eq!(block.0, stream);
                block.3.extend_from_slice(payload);
                block.1 |= flags & FLAG_END_HEADERS;
            }
            _ => {
                assert!(open.is_none(), "nothing interrupts a header block");
                seen.push(Seen::Other {
                    frame_type,
                    flags,
                    stream,
                    payload: payload.to_vec(),
                });
                continue;
            }
        }
        if open
            .as_ref()
            .is_some_and(|block| block.1 & FLAG_END_HEADERS != 0)
        {
            let (stream, flags, priority, fragment) = open.take().unwrap();
            seen.push(Seen::Headers {
                stream,
                flags,
                priority,
                headers: decoder.decode(&fragment).unwrap(),
            });
        }
    }
    assert!(open.is_none(), "no header block is left open");
    seen
}

/// Feeds `input` in pieces of `step` bytes, as reads of a socket would deliver it.
fn rewrite(input: &[u8], step: usize) -> (Vec<u8>, usize) {
    let mut rewriter = AuthorityRewriter::default();
    let mut out = BytesMut::new();
    let mut replaced = 0;
    for piece in input.chunks(step) {
        replaced += rewriter.feed(piece, &mut out).unwrap();
    }
    (out.to_vec(), replaced)
}

fn authority_of(seen: &Seen) -> Vec<u8> {
    match seen {
        Seen::Headers { headers, .. } => headers
            .iter()
            .find(|(n, _)| n == b":authority")
            .map(|(_, v)| v.clone())
            .expect("an :authority header"),
        other => panic!("not a header block: {other:?}"),
    }
}

#[test]
fn the_kubelets_percent_encoded_socket_path_is_refused_by_h2s_parse() {
    assert!(!is_valid_authority(KUBELET_AUTHORITY));
    assert!(!is_valid_authority(b"/run/sock.sock"));
    assert!(is_valid_authority(b"localhost"));
    assert!(is_valid_authority(b"127.0.0.1:9464"));
}

#[test]
fn an_unparsable_authority_becomes_localhost_and_everything_else_is_kept() {
    let mut client = Client::new();
    let mut input = PREFACE.to_vec();
    input.extend(SETTINGS_FRAME);
    input.extend(client.headers(1, &request(KUBELET_AUTHORITY), false));
    input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0"));

    for step in [1, 7, 4096] {
        let (out, replaced) = rewrite(&input, step);
        assert_eq!(replaced, 1, "step {step}");
        let seen = server_view(&out);
        assert_eq!(seen.len(), 3);
        assert_eq!(
            seen[0],
            Seen::Other {
                frame_type: 0x4,
                flags: 0,
                stream: 0,
                payload: vec![]
            }
        );
        let mut expected = request(REPLACEMENT_AUTHORITY);
        match &seen[1] {
            Seen::Headers {
                stream,
                flags,
                headers,
                ..
            } => {
                assert_eq!((*stream, *flags), (1, FLAG_END_HEADERS));
                assert_eq!(headers, &std::mem::take(&mut expected));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            seen[2],
            Seen::Other {
                frame_type: 0x0,
                flags: FLAG_END_STREAM,
                stream: 1,
                payload: b"\0\0\0\0\0".to_vec()
            }
        );
    }
}

#[test]
fn a_valid_authority_is_kept_as_sent() {
    let mut client = Client::new();
    let mut input = PREFACE.to_vec();
    input.extend(client.headers(1, &request(b"localhost:1234"), true));
    let (out, replaced) = rewrite(&input, 3);
    assert_eq!(replaced, 0);
    assert_eq!(authority_of(&server_view(&out)[0]), b"localhost:1234");
}

#[test]
fn later_requests_that_name_the_clients_table_entry_are_rewritten_too() {
    // A client's encoder indexes the authority on the first request and names the entry
    // on the next ones: the filter must follow the client's table, and h2's must follow
    // ours.
    let mut client = Client::new();
    let mut input = PREFACE.to_vec();
    let first = client.headers(1, &request(KUBELET_AUTHORITY), true);
    let second = client.headers(3, &request(KUBELET_AUTHORITY), true);
    assert!(
        second.len() < first.len(),
        "the second request names table entries"
    );
    input.extend(first);
    input.extend(second);
    input.extend(client.headers(5, &request(b"localhost"), true));
    let (out, replaced) = rewrite(&input, 5);
    assert_eq!(replaced, 2);
    let seen = server_view(&out);
    let authorities: Vec<_> = seen.iter().map(authority_of).collect();
    assert_eq!(authorities, [&b"localhost"[..]; 3]);
}

#[test]
fn padding_priority_and_continuations_are_understood() {
    let mut client = Client::new();
    let block = client.block(&request(KUBELET_AUTHORITY));
    let (head, tail) = block.split_at(10);
    let priority = [0x80, 0, 0, 0, 15];
    let mut payload = vec![3];
    payload.extend(priority);
    payload.extend(head);
    payload.extend([0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
        1,
        &payload,
    ));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, tail));

    let (out, replaced) = rewrite(&input, 2);
    assert_eq!(replaced, 1);
    match &server_view(&out)[..] {
        [
            Seen::Headers {
                stream: 1,
                flags,
                priority: Some(kept),
                headers,
            },
        ] => {
            assert_eq!(*flags, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
            assert_eq!(kept, &priority);
            assert_eq!(headers, &request(REPLACEMENT_AUTHORITY));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_block_larger_than_the_servers_frame_size_is_split_into_continuations() {
    let mut headers = request(KUBELET_AUTHORITY);
    for i in 0..8 {
        headers.push((format!("x-big-{i}").into_bytes(), vec![b'v'; 4000]));
    }
    let mut client = Client::new();
    let block = client.block(&headers);
    let mut input = PREFACE.to_vec();
    for (i, chunk) in block.chunks(10_000).enumerate() {
        let last = (i + 1) * 10_000 >= block.len();
        let frame_type = if i == 0 {
            TYPE_HEADERS
        } else {
            TYPE_CONTINUATION
        };
        input.extend(frame(
            frame_type,
            if last { FLAG_END_HEADERS } else { 0 },
            1,
            chunk,
        ));
    }
    let (out, replaced) = rewrite(&input, 1000);
    assert_eq!(replaced, 1);
    let seen = server_view(&out);
    let Seen::Headers { headers: got, .. } = &seen[0] else {
        panic!("{seen:?}")
    };
    headers[3].1 = REPLACEMENT_AUTHORITY.to_vec();
    assert_eq!(got, &headers);
}

#[test]
fn a_large_data_frame_passes_through_as_it_arrives() {
    let mut rewriter = AuthorityRewriter::default();
    let mut out = BytesMut::new();
    rewriter.feed(PREFACE, &mut out).unwrap();
    let data = frame(0x0, 0, 1, &[7; 100_000]);
    rewriter.feed(&data[..5_000], &mut out).unwrap();
    assert_eq!(
        out.len(),
        PREFACE.len() + 5_000,
        "nothing of a DATA frame is held back"
    );
    rewriter.feed(&data[5_000..], &mut out).unwrap();
    assert_eq!(&out[PREFACE.len()..], &data[..]);
}

fn feed_all(input: &[u8]) -> Result<usize, AuthorityError> {
    let mut rewriter = AuthorityRewriter::default();
    rewriter.feed(input, &mut BytesMut::new())
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    assert_eq!(
        feed_all(b"GET / HTTP/1.1\r\n"),
        Err(AuthorityError::NoPreface)
    );

    let with_preface = |frames: &[Vec<u8>]| {
        let mut input = PREFACE.to_vec();
        frames.iter().for_each(|f| input.extend(f));
        feed_all(&input)
    };
    let block = Client::new().block(&request(KUBELET_AUTHORITY));
    assert_eq!(
        with_preface(&[frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &block)]),
        Err(AuthorityError::StrayContinuation { stream: 1 })
    );
    assert_eq!(
        with_preface(&[frame(TYPE_HEADERS, 0, 1, &block), frame(0x0, 0, 1, b"x")]),
        Err(AuthorityError::Interrupted {
            stream: 1,
            frame_type: 0
        })
    );
    assert_eq!(
        with_preface(&[
            frame(TYPE_HEADERS, 0, 1, &block),
            frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &block)
        ]),
        Err(AuthorityError::Interrupted {
            stream: 1,
            frame_type: TYPE_CONTINUATION
        })
    );
    assert_eq!(
        with_preface(&[frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_END_HEADERS,
            1,
            &[200, 1, 2]
        )]),
        Err(AuthorityError::BadPadding { stream: 1 })
    );
    assert_eq!(
        with_preface(&[frame(
            TYPE_HEADERS,
            FLAG_PRIORITY | FLAG_END_HEADERS,
            1,
            &[0, 0]
        )]),
        Err(AuthorityError::BadPadding { stream: 1 })
    );
    // An index no table has.
    assert!(matches!(
        with_preface(&[frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x80 | 70])]),
        Err(AuthorityError::Hpack { stream: 1, .. })
    ));
    // A client may not grow the table past what h2 allows (a size update of 65536).
    assert!(matches!(
        with_preface(&[frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &[0x3f, 0xe1, 0xff, 0x03, 0x82]
        )]),
        Err(AuthorityError::Hpack {
            stream: 1,
            source: DecoderError::InvalidMaxDynamicSize
        })
    ));
    let mut huge = frame(TYPE_HEADERS, 0, 1, &[]);
    huge[..3].copy_from_slice(&[0x10, 0, 0]);
    assert_eq!(
        with_preface(&[huge]),
        Err(AuthorityError::BlockTooLarge {
            stream: 1,
            len: 0x10_0000
        })
    );
    let pieces: Vec<_> = (0..5)
        .map(|i| {
            frame(
                if i == 0 {
                    TYPE_HEADERS
                } else {
                    TYPE_CONTINUATION
                },
                0,
                1,
                &[0; 16_000],
            )
        })
        .collect();
    assert!(matches!(
        with_preface(&pieces),
        Err(AuthorityError::BlockTooLarge { stream: 1, .. })
    ));
}

/// Found while writing the `authority` fuzz target: a block within the size bound can
/// name one large entry of the table over and over. Refused, not decoded into memory.
#[test]
fn a_block_that_decodes_to_a_huge_list_is_refused() {
    let mut block = Client::new().block(&[(b"x-big".to_vec(), vec![b'a'; 4000])]);
    // The entry just added to the table is index 62: one byte, 0x80 | 62, each time.
    block.extend(std::iter::repeat_n(0x80 | 62, 16_000));
    let mut frames = Vec::new();
    for (i, chunk) in block.chunks(16_000).enumerate() {
        let last = (i + 1) * 16_000 >= block.len();
        let frame_type = if i == 0 {
            TYPE_HEADERS
        } else {
            TYPE_CONTINUATION
        };
        let flags = if last { FLAG_END_HEADERS } else { 0 };
        frames.push(frame(frame_type, flags, 1, chunk));
    }
    let mut input = PREFACE.to_vec();
    input.extend(frames.concat());
    assert_eq!(
        feed_all(&input),
        Err(AuthorityError::ListTooLarge { stream: 1 })
    );
}
