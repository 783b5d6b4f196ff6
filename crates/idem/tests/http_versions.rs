//! The gateway speaks HTTP/1.1 to its clients whatever its upstream
//! speaks: an HTTP/1.0 upstream's answer reaches an HTTP/1.1 client as
//! HTTP/1.1 on a connection that stays open, replays included, a body the
//! upstream ends by closing arrives whole, and a client that speaks
//! HTTP/1.0 still gets a whole answer it can read. Both ends are raw
//! sockets, so that no client library hides the status line or the close.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::{Gateway, Site};

const PAYOUT: &str = r#"{"seller":847,"amount":1200}"#;

/// How an HTTP/1.0 upstream ends its answer's body.
#[derive(Clone, Copy)]
enum Framing {
    /// A `Content-Length`, then the close.
    Length,
    /// No length: the body is everything until the close, sent in pieces.
    Close,
}

/// An upstream that speaks HTTP/1.0: one request a connection, answered
/// `201 Created`, then closed.
struct OldUpstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl OldUpstream {
    fn start(framing: Framing) -> OldUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                std::thread::spawn(move || answer(stream, framing, n));
            }
        });
        OldUpstream { addr, hits }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// The body of the `n`th answer: distinct per answer, and long enough for
/// a close-delimited one to arrive in many reads.
fn body_of(n: usize, framing: Framing) -> String {
    match framing {
        Framing::Length => format!(r#"{{"payout":{n}}}"#),
        Framing::Close => format!(r#"{{"payout":{n},"pad":"{}"}}"#, "x".repeat(200_000)),
    }
}

/// Reads one request off `stream` and answers it in HTTP/1.0, then closes.
fn answer(stream: TcpStream, framing: Framing, n: usize) {
    let mut reader = BufReader::new(stream);
    let head = read_head(&mut reader).unwrap_or_default();
    let mut body = vec![0; content_length(&head).unwrap_or(0)];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let mut stream = reader.into_inner();
    let body = body_of(n, framing);
    let head = match framing {
        Framing::Length => format!(
            "HTTP/1.0 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        ),
        Framing::Close => "HTTP/1.0 201 Created\r\ncontent-type: application/json\r\n\r\n".into(),
    };
    let _ = stream.write_all(head.as_bytes());
    for piece in body.as_bytes().chunks(16 * 1024) {
        let _ = stream.write_all(piece);
        let _ = stream.flush();
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// A message head up to its blank line; `None` when the peer closed first.
fn read_head(reader: &mut impl BufRead) -> Option<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            return Some(head);
        }
    }
}

fn content_length(head: &str) -> Option<usize> {
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

/// A POST of a payout under `key`, in `version`.
fn request(version: &str, key: &str) -> String {
    format!(
        "POST /payouts {version}\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         idempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{PAYOUT}",
        PAYOUT.len()
    )
}

/// One answer on `reader`: its head and its `Content-Length` body; `None`
/// when the gateway closed the connection instead.
fn read_answer(reader: &mut BufReader<TcpStream>) -> Option<(String, String)> {
    let head = read_head(reader)?;
    let length = content_length(&head).unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, String::from_utf8(body).unwrap()))
}

/// A client connection to the gateway, sending HTTP/1.1 requests one
/// after the other on it.
struct KeptConnection {
    reader: BufReader<TcpStream>,
}

impl KeptConnection {
    fn open(gw: &Gateway) -> KeptConnection {
        let stream = TcpStream::connect(gw.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        KeptConnection {
            reader: BufReader::new(stream),
        }
    }

    /// Sends a payout under `key`; the answer, which must come on this
    /// connection in HTTP/1.1.
    fn post(&mut self, key: &str, nth: &str) -> (String, String) {
        let sent = self
            .reader
            .get_mut()
            .write_all(request("HTTP/1.1", key).as_bytes());
        let answer = sent.ok().and_then(|()| read_answer(&mut self.reader));
        let (head, body) =
            answer.unwrap_or_else(|| panic!("the {nth} request found the connection closed"));
        assert!(head.starts_with("HTTP/1.1 201 "), "{nth}: {head}");
        (head, body)
    }
}

#[test]
fn an_http_1_0_upstream_answers_http_1_1_clients_in_http_1_1_on_a_kept_connection() {
    let (up, site) = (OldUpstream::start(Framing::Length), Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let mut client = KeptConnection::open(&gw);
    let (_, first) = client.post("k-old-1", "first");
    assert_eq!(first, body_of(1, Framing::Length));
    let (_, second) = client.post("k-old-2", "second");
    assert_eq!(second, body_of(2, Framing::Length));
    // A replay is the stored answer, which has no version of its own.
    let (_, again) = client.post("k-old-1", "replayed");
    assert_eq!(again, first);
    assert_eq!(up.hits(), 2, "the replay reached the upstream");
}

#[test]
fn a_body_the_upstream_ends_by_closing_arrives_whole() {
    let (up, site) = (OldUpstream::start(Framing::Close), Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    let mut client = KeptConnection::open(&gw);
    let (_, first) = client.post("k-close-1", "first");
    assert_eq!(first, body_of(1, Framing::Close), "cut short or changed");
    let (_, second) = client.post("k-close-2", "second");
    assert_eq!(second, body_of(2, Framing::Close));
}

#[test]
fn a_client_that_speaks_http_1_0_gets_a_whole_answer_and_the_close() {
    let (up, site) = (OldUpstream::start(Framing::Length), Site::new());
    let gw = Gateway::start(&up.url(), &site.store(), None);
    for key in ["k-client-1", "k-client-1"] {
        let mut stream = TcpStream::connect(gw.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream
            .write_all(request("HTTP/1.0", key).as_bytes())
            .unwrap();
        // The gateway closes after the answer, as HTTP/1.0 without
        // keep-alive asks: reading to the end returns.
        let mut said = String::new();
        stream.read_to_string(&mut said).unwrap();
        let (head, body) = said.split_once("\r\n\r\n").unwrap();
        // Either version is an answer it reads; hyper answers in its own.
        let status = head.split_once(' ').map(|(_, rest)| rest);
        assert!(
            status.is_some_and(|s| s.starts_with("201 ")) && head.starts_with("HTTP/1."),
            "{head}"
        );
        assert!(
            !head.to_ascii_lowercase().contains("transfer-encoding"),
            "chunked to an HTTP/1.0 client: {head}"
        );
        assert_eq!(content_length(head), Some(body.len()), "{head}");
        assert_eq!(body, body_of(1, Framing::Length));
    }
    assert_eq!(up.hits(), 1);
}
